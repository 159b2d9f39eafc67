# Writes OUT, a header defining LT_GIT_COMMIT as the source tree's commit when the build runs: git's
# short hash, "-dirty" when the tree differs from it, "unknown" outside git. Run at every build
# (not only at configure time), so a binary built from edited sources says so; the header is
# rewritten only when the stamp changes, so an unchanged tree recompiles nothing.
set(stamp "unknown")
find_package(Git QUIET)
if(GIT_FOUND)
  execute_process(COMMAND ${GIT_EXECUTABLE} rev-parse --short=12 HEAD WORKING_DIRECTORY ${SRC}
                  OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE rc ERROR_QUIET)
  if(rc EQUAL 0 AND head)
    set(stamp ${head})
    execute_process(COMMAND ${GIT_EXECUTABLE} diff --quiet HEAD WORKING_DIRECTORY ${SRC} RESULT_VARIABLE dirty
                    ERROR_QUIET)
    if(NOT dirty EQUAL 0)
      string(APPEND stamp "-dirty")
    endif()
  endif()
endif()
set(text "#define LT_GIT_COMMIT \"${stamp}\"\n")
set(old "")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT old STREQUAL text)
  file(WRITE ${OUT} "${text}")
endif()
