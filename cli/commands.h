// The subcommands of the clla binary. Each parses its own arguments, prints --help,
// and returns the process exit status.
#ifndef CLLA_CLI_COMMANDS_H
#define CLLA_CLI_COMMANDS_H

int cmd_train(int argc, char **argv);     // cli/cmd_train.c
int cmd_eval(int argc, char **argv);      // cli/cmd_eval.c
int cmd_info(int argc, char **argv);      // cli/cmd_info.c
int cmd_init(int argc, char **argv);      // cli/cmd_init.c
int cmd_debug_step(int argc, char **argv);  // tests' entry: one forward+backward dumped (cli/cmd_debug_step.c)
int cmd_prep(int argc, char **argv);      // cli/cmd_prep.c
int cmd_tokenizer(int argc, char **argv); // cli/cmd_tokenizer.c
int cmd_generate(int argc, char **argv);  // cli/cmd_generate.c
int cmd_export(int argc, char **argv);    // cli/cmd_export.c
int cmd_calibrate(int argc, char **argv); // cli/cmd_calibrate.c

#endif
