/* The sandbox ("pause") process of the CRI suite's pods: holds the pod's namespaces and does
 * nothing else. Built static (musl-gcc) so the image is one file; tests/cri/node.py packs it
 * as an OCI archive and imports it with ctr. The same file keeps the node's private mount
 * namespace alive. SIGTERM/SIGINT end it (StopPodSandbox); as PID 1 of a pod it reaps. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
    (void)sig;
    _exit(0);
}

static void reap(int sig) {
    (void)sig;
    while (waitpid(-1, 0, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction on_stop = {.sa_handler = stop};
    struct sigaction on_child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &on_stop, 0);
    sigaction(SIGTERM, &on_stop, 0);
    sigaction(SIGCHLD, &on_child, 0);
    for (;;) {
        pause();
    }
}
