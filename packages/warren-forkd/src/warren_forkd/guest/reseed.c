/* warren-reseed: credit the seed read from stdin to the kernel's input pool, then force the
 * CRNG to reseed. Writing to /dev/urandom alone only mixes the bytes in; a child restored from a
 * snapshot would keep producing its parent's stream until the next scheduled reseed.
 * Built without libc (raw syscalls) so the template needs no static C library. */
#include <linux/random.h>

static long sys3(long n, long a, long b, long c) {
  long r;
  __asm__ volatile("syscall" : "=a"(r) : "a"(n), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
  return r;
}

enum { SYS_READ = 0, SYS_WRITE = 1, SYS_OPEN = 2, SYS_IOCTL = 16, SYS_EXIT = 60, SEED_MAX = 256 };

static struct {
  struct rand_pool_info info;
  unsigned char buf[SEED_MAX];
} seed;

static void fail(const char *msg, long len) {
  sys3(SYS_WRITE, 2, (long)msg, len);
  sys3(SYS_EXIT, 1, 0, 0);
}

void _start(void) {
  long n = 0, r;
  while (n < SEED_MAX && (r = sys3(SYS_READ, 0, (long)seed.buf + n, SEED_MAX - n)) > 0) n += r;
  if (n < 16) fail("seed too short\n", 15);
  long fd = sys3(SYS_OPEN, (long)"/dev/urandom", 2 /* O_RDWR */, 0);
  if (fd < 0) fail("open /dev/urandom\n", 18);
  seed.info.entropy_count = (int)(n * 8);
  seed.info.buf_size = (int)n;
  if (sys3(SYS_IOCTL, fd, RNDADDENTROPY, (long)&seed.info) < 0) fail("RNDADDENTROPY\n", 14);
  if (sys3(SYS_IOCTL, fd, RNDRESEEDCRNG, 0) < 0) fail("RNDRESEEDCRNG\n", 14);
  sys3(SYS_EXIT, 0, 0, 0);
}
