/* longtune's public API in one include: every header of include/longtune/. Programs may include
 * this or only the module headers they use; link with `pkg-config --libs longtune` (add --static
 * for the static library). Every exported symbol starts with lt_, every macro and enum value
 * with LT_. */
#ifndef LONGTUNE_H
#define LONGTUNE_H

#include "longtune/export.h"
#include "longtune/status.h"
#include "longtune/log.h"
#include "longtune/alloc.h"
#include "longtune/tensor.h"
#include "longtune/sysinfo.h"
#include "longtune/safetensors.h"
#include "longtune/gguf.h"
#include "longtune/tokenizer.h"
#include "longtune/chat.h"
#include "longtune/pack.h"
#include "longtune/dataset.h"
#include "longtune/attention.h"
#include "longtune/lce.h"
#include "longtune/comm.h"
#include "longtune/context_parallel.h"
#include "longtune/model.h"
#include "longtune/kv_cache.h"
#include "longtune/generate.h"
#include "longtune/plan.h"
#include "longtune/guard.h"
#include "longtune/train.h"
#include "longtune/export_model.h"

#endif
