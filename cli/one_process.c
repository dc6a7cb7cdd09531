#include "cli/one_process.h"

#include "common/util.h"
#include "train/dist.h"

void cli_one_process(const char *what) {
    const char *var = NULL;
    const int n = dist_launched_ranks(&var);
    if (n > 1)
        die("%s runs as one process, and this one is one of %d ranks (%s): each would do the whole job and write its output again; run it without mpirun or srun",
            what, n, var);
}
