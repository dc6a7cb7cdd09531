// clla --version: the commit the binary was configured from and the optional parts it was
// built with, so a bug report or a benchmark names exactly what ran.
#ifndef CLLA_COMMON_VERSION_H
#define CLLA_COMMON_VERSION_H

#include <stdio.h>

// "clla <git describe> (CUDA yes|no, MPI yes|no, NCCL yes|no, PCRE2 yes|no)" and the compiler.
void version_print(FILE *out);

#endif
