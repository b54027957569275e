// LD_PRELOAD helper for crash reports on machines without gdb: on SIGSEGV / SIGABRT prints the
// native backtrace (backtrace_symbols_fd) to stderr, then dies with the same signal.
// Build: gcc -shared -fPIC -O0 -g -o segv_backtrace.so segv_backtrace.c
// Use:   LD_PRELOAD=$PWD/segv_backtrace.so python3 ...
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

static void on_fatal(int sig) {
  void* frames[128];
  const char msg[] = "\n*** segv_backtrace: fatal signal, native frames:\n";
  write(2, msg, sizeof(msg) - 1);
  const int n = backtrace(frames, 128);
  backtrace_symbols_fd(frames, n, 2);
  signal(sig, SIG_DFL);
  raise(sig);
}

__attribute__((constructor)) static void install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_fatal;
  sa.sa_flags = SA_RESETHAND | SA_NODEFER;
  sigaction(SIGSEGV, &sa, 0);
  sigaction(SIGABRT, &sa, 0);
}
