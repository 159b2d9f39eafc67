/* The stop request a signal handler raises and the trainer polls between steps (and between
 * validation batches), and whether a stop now would save a checkpoint (the trainer's steps) or
 * has nothing to save (loading). Only a
 * sig_atomic_t is touched, so lt_train_request_stop is async-signal-safe; installing handlers is
 * the CLI's business. */
#include <signal.h>

#include "longtune/train.h"

static volatile sig_atomic_t stop_signal, stop_saves;

void lt_train_request_stop(int signo) { stop_signal = signo > 0 ? signo : 1; }
int lt_train_stop_requested(void) { return (int)stop_signal; }
void lt_train_clear_stop(void) { stop_signal = 0; }
int lt_train_stop_saves(void) { return (int)stop_saves; }
void lt_train_set_stop_saves(int on) { stop_saves = on != 0; }
