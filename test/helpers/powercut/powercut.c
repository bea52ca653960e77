/*
 * powercut: an LD_PRELOAD library that records what a power cut would leave of a directory, at
 * fsync granularity. It is an EMULATION, not a power cut: see docs/benchmarks.md "The power-loss
 * emulation" for what it models and what it does not.
 *
 *   REEF_POWERCUT_DIR      the watched directory (a store's data dir)
 *   REEF_POWERCUT_SHADOW   where the durable image is kept (outside the watched directory)
 *
 * After the real fsync/fdatasync of a file under the watched directory returns, the file's whole
 * current contents are copied to <shadow>/data/<dev>_<ino> and linked at <shadow>/tree/<path>, all
 * before the call returns to the caller, so nothing the caller does after its fsync (send a
 * receipt) can come before the image. An fsync of a directory makes its current entries durable:
 * each name points at its file's last image (an empty file if the file was never fsynced), and
 * names no longer in it are dropped. <shadow>/tree is then the directory as a power cut would
 * leave it; the harness (test/helpers/powercut.ts, python_shim/tests/powercut.py) SIGKILLs the
 * writers and puts the tree in place of the watched directory.
 *
 * Simplifications, stated here and in the docs:
 *  - Nothing written after a file's last fsync survives (no unsynced page reached the disk) and
 *    nothing is torn: the image is the file's whole contents at that fsync.
 *  - An fsync of a file also makes its current name durable (and its parent directories): POSIX
 *    wants an fsync of the directory for a new name; ext4 happens to commit it with the file.
 *  - A directory renamed is not followed: its files stay durable under the names they were fsynced
 *    or listed under.
 *  - sync_file_range() makes nothing durable (it flushes neither metadata nor the disk's cache),
 *    so it is not intercepted. O_SYNC/O_DSYNC writes are not modelled (neither SQLite nor the
 *    Python ledger uses them).
 *  - sync(), syncfs() and msync() snapshot by opening the files again; for a file holding POSIX
 *    (fcntl) locks that close drops the process's locks. SQLite and CPython call none of the three
 *    here (SQLite's unix VFS uses fsync or fdatasync; os.fsync is fsync), and fsync/fdatasync read
 *    through the caller's own descriptor unless it is write-only.
 *
 * Every snapshot runs under an flock on <shadow>/lock, so two threads or processes syncing the same
 * file leave the later copy, never an older one renamed in last. A snapshot that fails aborts the
 * process: an image silently missing would read as a lost commit.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <unistd.h>

static char root[PATH_MAX];
static size_t rootlen;
static char shadow[PATH_MAX];
static int enabled;
static unsigned long counter;

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static int (*real_syncfs)(int);
static void (*real_sync)(void);
static int (*real_msync)(void *, size_t, int);

static void resolve(void) {
  if (real_fsync) return;
  real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
  real_syncfs = (int (*)(int))dlsym(RTLD_NEXT, "syncfs");
  real_sync = (void (*)(void))dlsym(RTLD_NEXT, "sync");
  real_msync = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "msync");
  real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
}

static void die(const char *fmt, ...) {
  char msg[PATH_MAX * 3];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "powercut (pid %d): %s\n", (int)getpid(), msg);
  abort();
}

static void path_join(char *out, const char *a, const char *b) {
  if ((size_t)snprintf(out, PATH_MAX, "%s%s", a, b) >= PATH_MAX) die("path too long: %s%s", a, b);
}

static void new_tmp(char *out) {
  unsigned long n = __atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED);
  if ((size_t)snprintf(out, PATH_MAX, "%s/tmp/%d.%ld.%lu", shadow, (int)getpid(), (long)syscall(SYS_gettid), n) >= PATH_MAX) die("shadow path too long");
}

static void mkdirs(const char *path) {
  char p[PATH_MAX];
  path_join(p, path, "");
  for (char *s = p + 1; *s; s++) {
    if (*s != '/') continue;
    *s = 0;
    if (mkdir(p, 0755) != 0 && errno != EEXIST) die("mkdir %s: %s", p, strerror(errno));
    *s = '/';
  }
  if (mkdir(p, 0755) != 0 && errno != EEXIST) die("mkdir %s: %s", p, strerror(errno));
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
  (void)st; (void)flag; (void)ftw;
  if (remove(p) != 0 && errno != ENOENT) die("remove %s: %s", p, strerror(errno));
  return 0;
}

static void rm_rf(const char *p) {
  struct stat st;
  if (lstat(p, &st) != 0) return;
  if (S_ISDIR(st.st_mode)) nftw(p, rm_one, 16, FTW_DEPTH | FTW_PHYS);
  else if (unlink(p) != 0 && errno != ENOENT) die("unlink %s: %s", p, strerror(errno));
}

/* The part of `abs` below the watched directory ("" for the directory itself), or NULL. */
static const char *watched_rel(const char *abs) {
  if (strncmp(abs, root, rootlen) != 0) return NULL;
  if (abs[rootlen] != '/' && abs[rootlen] != 0) return NULL;
  return abs + rootlen;
}

static const char *fd_path(int fd, char *out) {
  char link[64];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, out, PATH_MAX - 1);
  if (n < 0) return NULL;
  out[n] = 0;
  if (n > 10 && strcmp(out + n - 10, " (deleted)") == 0) return NULL;
  return watched_rel(out);
}

static int lock_shadow(void) {
  char p[PATH_MAX];
  path_join(p, shadow, "/lock");
  int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) die("open %s: %s", p, strerror(errno));
  while (flock(fd, LOCK_EX) != 0)
    if (errno != EINTR) die("flock %s: %s", p, strerror(errno));
  return fd;
}

static void data_key(char *out, const struct stat *st) {
  if ((size_t)snprintf(out, PATH_MAX, "%s/data/%llx_%llx", shadow, (unsigned long long)st->st_dev, (unsigned long long)st->st_ino) >= PATH_MAX) die("shadow path too long");
}

/* Copies the whole of `src` (read with pread, so the caller's offset does not move) into a new file. */
static void copy_all(int src, const char *dst, const char *what) {
  int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (out < 0) die("create %s: %s", dst, strerror(errno));
  size_t cap = 1 << 20;
  char *buf = malloc(cap);
  if (!buf) die("out of memory");
  off_t at = 0;
  for (;;) {
    ssize_t n = pread(src, buf, cap, at);
    if (n < 0) {
      if (errno == EINTR) continue;
      die("read %s: %s", what, strerror(errno));
    }
    if (n == 0) break;
    for (ssize_t done = 0; done < n;) {
      ssize_t w = write(out, buf + done, (size_t)(n - done));
      if (w < 0) {
        if (errno == EINTR) continue;
        die("write %s: %s", dst, strerror(errno));
      }
      done += w;
    }
    at += n;
  }
  free(buf);
  if (close(out) != 0) die("close %s: %s", dst, strerror(errno));
}

/* Moves `tmp` to `dst`, replacing whatever is there (a directory where a file now is included). */
static void put(const char *tmp, const char *dst) {
  if (rename(tmp, dst) == 0) return;
  if (errno == EISDIR || errno == ENOTEMPTY || errno == EEXIST) {
    rm_rf(dst);
    if (rename(tmp, dst) == 0) return;
  }
  die("rename %s -> %s: %s", tmp, dst, strerror(errno));
}

/* The file `rel` (opened as `fd`) is durable as it is now, under its current name. */
static void snap_file(int fd, const struct stat *st, const char *rel, const char *what) {
  char tmp[PATH_MAX], tmp2[PATH_MAX], key[PATH_MAX], tree[PATH_MAX], dir[PATH_MAX];
  new_tmp(tmp);
  copy_all(fd, tmp, what);
  new_tmp(tmp2);
  if (link(tmp, tmp2) != 0) die("link %s: %s", tmp2, strerror(errno));
  data_key(key, st);
  put(tmp, key);
  if ((size_t)snprintf(tree, PATH_MAX, "%s/tree%s", shadow, rel) >= PATH_MAX) die("shadow path too long");
  path_join(dir, tree, "");
  char *slash = strrchr(dir, '/');
  *slash = 0;
  mkdirs(dir);
  put(tmp2, tree);
}

/* The directory `rel` (at `abs`): its current entries are durable, its removed ones gone. */
static void snap_dir(const char *abs, const char *rel) {
  char tree[PATH_MAX], p[PATH_MAX], key[PATH_MAX], tmp[PATH_MAX];
  if ((size_t)snprintf(tree, PATH_MAX, "%s/tree%s", shadow, rel) >= PATH_MAX) die("shadow path too long");
  mkdirs(tree);
  DIR *d = opendir(abs);
  if (!d) die("opendir %s: %s", abs, strerror(errno));
  size_t count = 0, cap = 64;
  char **names = malloc(cap * sizeof *names);
  if (!names) die("out of memory");
  struct dirent *e;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue; /* gone meanwhile */
    if ((size_t)snprintf(p, PATH_MAX, "%s/%s", tree, e->d_name) >= PATH_MAX) die("shadow path too long");
    if (S_ISREG(st.st_mode)) {
      data_key(key, &st);
      new_tmp(tmp);
      if (link(key, tmp) != 0) {
        if (errno != ENOENT) die("link %s: %s", key, strerror(errno));
        /* Never fsynced: the name is durable, none of the data. */
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) die("create %s: %s", tmp, strerror(errno));
        close(fd);
      }
      put(tmp, p);
    } else if (S_ISDIR(st.st_mode)) {
      struct stat have;
      if (lstat(p, &have) == 0 && !S_ISDIR(have.st_mode)) rm_rf(p);
      if (mkdir(p, 0755) != 0 && errno != EEXIST) die("mkdir %s: %s", p, strerror(errno));
    } else {
      continue; /* symlinks, sockets, fifos: not modelled */
    }
    if (count == cap) {
      cap *= 2;
      names = realloc(names, cap * sizeof *names);
      if (!names) die("out of memory");
    }
    names[count++] = strdup(e->d_name);
  }
  closedir(d);
  DIR *t = opendir(tree);
  if (!t) die("opendir %s: %s", tree, strerror(errno));
  while ((e = readdir(t)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    int kept = 0;
    for (size_t i = 0; i < count && !kept; i++) kept = strcmp(names[i], e->d_name) == 0;
    if (kept) continue;
    if ((size_t)snprintf(p, PATH_MAX, "%s/%s", tree, e->d_name) >= PATH_MAX) die("shadow path too long");
    rm_rf(p);
  }
  closedir(t);
  for (size_t i = 0; i < count; i++) free(names[i]);
  free(names);
}

/* After a successful fsync/fdatasync of `fd`. */
static void after_sync(int fd) {
  if (!enabled) return;
  char abs[PATH_MAX];
  const char *rel = fd_path(fd, abs);
  if (!rel) return;
  struct stat st;
  if (fstat(fd, &st) != 0) die("fstat %s: %s", abs, strerror(errno));
  if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) return;
  int saved = errno;
  int lock = lock_shadow();
  if (S_ISDIR(st.st_mode)) {
    snap_dir(abs, rel);
  } else {
    int flags = fcntl(fd, F_GETFL);
    if ((flags & O_ACCMODE) == O_WRONLY) {
      /* Python's open(path, "w"): read it through a second descriptor (no fcntl locks on these). */
      char proc[64];
      snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
      int rd = open(proc, O_RDONLY | O_CLOEXEC);
      if (rd < 0) die("reopen %s: %s", abs, strerror(errno));
      snap_file(rd, &st, rel, abs);
      close(rd);
    } else {
      snap_file(fd, &st, rel, abs);
    }
  }
  close(lock);
  errno = saved;
}

static int snap_walk(const char *p, const struct stat *st, int flag, struct FTW *ftw) {
  (void)ftw;
  const char *rel = watched_rel(p);
  if (!rel) return 0;
  if (flag == FTW_F && S_ISREG(st->st_mode)) {
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0; /* removed meanwhile */
    snap_file(fd, st, rel, p);
    close(fd);
  } else if (flag == FTW_DP) {
    snap_dir(p, rel);
  }
  return 0;
}

/* sync()/syncfs(): everything under the watched directory, each directory after its files. */
static void snap_all(void) {
  int lock = lock_shadow();
  nftw(root, snap_walk, 16, FTW_DEPTH | FTW_PHYS);
  close(lock);
}

__attribute__((constructor)) static void powercut_init(void) {
  resolve();
  const char *w = getenv("REEF_POWERCUT_DIR"), *s = getenv("REEF_POWERCUT_SHADOW");
  if (!w || !s || !*w || !*s) return;
  if (!realpath(w, root)) die("REEF_POWERCUT_DIR=%s: %s", w, strerror(errno));
  if (!realpath(s, shadow)) die("REEF_POWERCUT_SHADOW=%s: %s", s, strerror(errno));
  rootlen = strlen(root);
  if (watched_rel(shadow)) die("REEF_POWERCUT_SHADOW (%s) must be outside REEF_POWERCUT_DIR (%s)", shadow, root);
  char p[PATH_MAX];
  const char *subs[] = {"/tree", "/data", "/tmp"};
  for (size_t i = 0; i < 3; i++) {
    path_join(p, shadow, subs[i]);
    mkdirs(p);
  }
  /* One line per process that loaded the library: the harness checks it is not testing nothing. */
  path_join(p, shadow, "/loaded");
  int fd = open(p, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) die("open %s: %s", p, strerror(errno));
  char line[32];
  int n = snprintf(line, sizeof line, "%d\n", (int)getpid());
  if (write(fd, line, (size_t)n) != n) die("write %s: %s", p, strerror(errno));
  close(fd);
  enabled = 1;
}

int fsync(int fd) {
  resolve();
  int rc = real_fsync(fd);
  if (rc == 0) after_sync(fd);
  return rc;
}

int fdatasync(int fd) {
  resolve();
  int rc = real_fdatasync(fd);
  if (rc == 0) after_sync(fd);
  return rc;
}

int syncfs(int fd) {
  resolve();
  int rc = real_syncfs(fd);
  struct stat a, b;
  if (rc == 0 && enabled && fstat(fd, &a) == 0 && stat(root, &b) == 0 && a.st_dev == b.st_dev) {
    int saved = errno;
    snap_all();
    errno = saved;
  }
  return rc;
}

void sync(void) {
  resolve();
  real_sync();
  if (enabled) {
    int saved = errno;
    snap_all();
    errno = saved;
  }
}

int msync(void *addr, size_t len, int flags) {
  resolve();
  int rc = real_msync(addr, len, flags);
  if (rc != 0 || !enabled || !(flags & MS_SYNC)) return rc;
  int saved = errno;
  FILE *maps = fopen("/proc/self/maps", "re");
  if (!maps) die("open /proc/self/maps: %s", strerror(errno));
  char line[PATH_MAX + 256];
  unsigned long a = (unsigned long)addr;
  while (fgets(line, sizeof line, maps)) {
    unsigned long lo, hi;
    int off = 0;
    if (sscanf(line, "%lx-%lx %*s %*s %*s %*s %n", &lo, &hi, &off) < 2 || off == 0) continue;
    if (a < lo || a >= hi) continue;
    char *path = line + off;
    path[strcspn(path, "\n")] = 0;
    const char *rel = *path == '/' ? watched_rel(path) : NULL;
    if (rel) {
      int fd = open(path, O_RDONLY | O_CLOEXEC);
      struct stat st;
      if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        int lock = lock_shadow();
        snap_file(fd, &st, rel, path);
        close(lock);
      }
      if (fd >= 0) close(fd);
    }
    break;
  }
  fclose(maps);
  errno = saved;
  return rc;
}
