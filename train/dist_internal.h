// Shared by the files of the process group (train/dist.c, train/dist_buckets.c); no other
// file includes it.
#ifndef CLLA_TRAIN_DIST_INTERNAL_H
#define CLLA_TRAIN_DIST_INTERNAL_H

#include <stddef.h>

#include "train/dist.h"

#if defined(CLLA_HAVE_NCCL) && defined(CLLA_HAVE_MPI)
#include "kernels/nccl_comm.h"
#define DIST_NCCL 1   // NCCL needs MPI here: the unique id travels with dist_bcast
#endif

#ifdef CLLA_HAVE_MPI
// Around a wait for the other ranks: the time goes to d->comm_seconds, and the watchdog
// (train.dist_timeout_s) sees `what` (a string literal) while it lasts.
void dist_enter(Dist *d, const char *what, double *t0);
void dist_leave(Dist *d, double t0);
#endif

#endif
