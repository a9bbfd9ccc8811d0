/* The pod sandbox's placeholder process: holds the pod's namespaces open, reaps orphaned
 * children (it is PID 1 when the pod shares one PID namespace) and exits on SIGINT/SIGTERM.
 * Built statically by `warren image build pause`. */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void leave(int sig) { _exit(sig == SIGTERM || sig == SIGINT ? 0 : 1); }

static void reap(int sig) {
  (void)sig;
  while (waitpid(-1, NULL, WNOHANG) > 0) {
  }
}

int main(void) {
  struct sigaction stop = {.sa_handler = leave};
  struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
  if (sigaction(SIGINT, &stop, NULL) < 0 || sigaction(SIGTERM, &stop, NULL) < 0 ||
      sigaction(SIGCHLD, &child, NULL) < 0) {
    return 1;
  }
  for (;;) pause();
  return 0;
}
