/* The sandbox's pause container: holds a pod's namespaces, reaps orphans.
 *
 * Built static (gcc -static -Os) into an image FROM scratch by
 * nmo_sandbox.images; registry.k8s.io/pause cannot be pulled here.
 * Sleeps until SIGTERM or SIGINT, reaping every child that exits meanwhile.
 */
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig) { (void)sig; stop = 1; }

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_child;
    sa.sa_flags = SA_NOCLDSTOP | SA_RESTART;
    sigaction(SIGCHLD, &sa, NULL);
    if (getpid() != 1) fprintf(stderr, "nmo-pause: warning: not PID 1\n");
    while (!stop) pause();
    return 0;
}
