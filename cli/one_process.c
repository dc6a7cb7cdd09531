#include "cli/one_process.h"

#include <stdlib.h>

#include "common/num.h"
#include "common/util.h"

void cli_one_process(const char *what) {
    static const char *const vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"};
    for (size_t i = 0; i < sizeof(vars) / sizeof(vars[0]); i++) {
        const char *v = getenv(vars[i]);
        uint64_t n = 0;
        if (v && num_parse_u64(v, UINT64_MAX, &n) == NUM_OK && n > 1)
            die("%s runs as one process, and this one is one of %llu ranks (%s): each would do the whole job and write its output again; run it without mpirun or srun",
                what, (unsigned long long)n, vars[i]);
    }
}
