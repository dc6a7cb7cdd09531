// Backend selection by name: "cpu" and "cpu-bf16" (bf16 emulation) always; "cuda" when built
// with the CUDA backend.
#ifndef CLLA_CLI_DEVICE_H
#define CLLA_CLI_DEVICE_H

#include "backend/backend.h"

// Dies with a message naming the available devices when name is unknown or not built.
const Backend *device_backend(const char *name);

#endif
