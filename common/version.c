#include "common/version.h"

// CMakeLists.txt defines CLLA_GIT_DESCRIBE for this file (git describe at configure time).
#ifndef CLLA_GIT_DESCRIBE
#define CLLA_GIT_DESCRIBE "unknown"
#endif

#ifdef CLLA_HAVE_CUDA
#define HAS_CUDA "yes"
#else
#define HAS_CUDA "no"
#endif
#ifdef CLLA_HAVE_MPI
#define HAS_MPI "yes"
#else
#define HAS_MPI "no"
#endif
#ifdef CLLA_HAVE_NCCL
#define HAS_NCCL "yes"
#else
#define HAS_NCCL "no"
#endif
#ifdef CLLA_HAVE_PCRE2
#define HAS_PCRE2 "yes"
#else
#define HAS_PCRE2 "no"
#endif

void version_print(FILE *out) {
    fprintf(out, "clla %s\n", CLLA_GIT_DESCRIBE);
    fprintf(out, "build: CUDA %s, MPI %s, NCCL %s, PCRE2 %s\n", HAS_CUDA, HAS_MPI, HAS_NCCL, HAS_PCRE2);
#ifdef __VERSION__
    fprintf(out, "compiler: %s\n", __VERSION__);
#endif
}
