// Commands that run as one process (all but train and eval --bench): under a launcher that
// started several ranks, each would do the whole job, print it once per rank and race on its
// output files. Refused at their start instead (docs/DISTRIBUTED.md, "Commands under mpirun").
#ifndef CLLA_CLI_ONE_PROCESS_H
#define CLLA_CLI_ONE_PROCESS_H

// Dies naming `what` when the environment says this process is one of several ranks
// (train/dist.c's table of launcher variables: OMPI_COMM_WORLD_SIZE, PMI_SIZE, SLURM_STEP_NUM_TASKS).
void cli_one_process(const char *what);

#endif
