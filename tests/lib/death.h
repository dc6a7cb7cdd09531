// Shared by the C tests that check a die(): runs fn(arg) in a forked child whose stderr is read
// through a pipe, and returns 1 when the child exited non-zero having printed "clla: error:" and
// every non-NULL needle; msg (cap bytes) receives what it printed. (Included once per test
// program.)
#ifndef CLLA_TESTS_LIB_DEATH_H
#define CLLA_TESTS_LIB_DEATH_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int died_with(void (*fn)(const void *), const void *arg, const char *n1, const char *n2, char *msg, size_t cap) {
    int pfd[2];
    if (pipe(pfd) != 0) { perror("pipe"); exit(1); }
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(pfd[1], 2);
        close(pfd[0]);
        fn(arg);
        _exit(0);
    }
    close(pfd[1]);
    size_t n = 0;
    ssize_t r;
    while (n < cap - 1 && (r = read(pfd[0], msg + n, cap - 1 - n)) > 0) n += (size_t)r;
    msg[n] = 0;
    close(pfd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) && WEXITSTATUS(status) != 0 && strstr(msg, "clla: error:") && (!n1 || strstr(msg, n1)) &&
           (!n2 || strstr(msg, n2));
}

#endif
