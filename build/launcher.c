/*
 * cnibox launcher: the first part of the single-file cnibox executable.
 *
 * File layout:  [this static musl program][zstd payload][64-byte trailer]
 * The payload is a record stream of the Nuitka standalone dist (build/pack.py writes it):
 *   per entry: u32 type ('d','f','l'), u32 mode, u32 path length, u32 0, u64 size, path, data
 * The trailer: "CNIBOX\x01\n", u64 payload offset, u64 payload size, u64 raw size,
 *   16 hex chars content hash, u64 format, u64 XXH64 of the preceding 56 bytes.
 *
 * What it does (docs/binary.md "The launcher"; issue #6):
 * 1. Fast path: for each extraction root (below), if <root>/<hash>/.ok exists, take a shared
 *    flock on it (kept across exec: it marks the directory as in use) and exec the bundled
 *    glibc loader on the main binary with argv unchanged:
 *      <dir>/LOADER --argv0 ARGV0 --library-path <dir> --inhibit-cache
 *                                 <dir>/cnibox.bin ARGS...
 *    One process (same pid), exit codes and signals direct, argv[0] preserved. Invoking the
 *    loader explicitly is what lets the root be chosen at run time: a PT_INTERP would have
 *    to name a fixed absolute path.
 * 2. Slow path (first run of this version): extract into a private mkdtemp directory next to
 *    the final one, write `.ok` last, rename() into place. A loser of a concurrent race
 *    deletes its copy and uses the winner's. Then old versions that nobody holds a lock on
 *    (flock LOCK_EX|LOCK_NB succeeds) and temp leftovers older than 10 minutes are removed.
 * 3. Extraction roots, first usable wins: $CNIBOX_CACHE if set (then the only candidate),
 *    else /var/lib/cnibox, /run/cnibox, /var/tmp/cnibox, /tmp/cnibox, /dev/shm/cnibox (disk
 *    first: on Talos /run is RAM, and a copy on disk survives a reboot).
 *    Usable = on a mount that is neither read-only nor noexec, and (for the defaults)
 *    owned by us and not writable by group or others, so nobody else can plant a payload.
 * 4. Exports LOCPATH=<dir>/locale (Nuitka's runtime aborts without a usable locale),
 *    CNIBOX_EXE=<this file> (what the installer copies) and CNIBOX_BUILD=<hash> (the node
 *    agent's version handshake). Every launcher error: a message on stderr and exit 127.
 * 0. Before all of that, invoked as the CNI plugin with a node agent answering, the agent
 *    serves the invocation and nothing is unpacked or executed (agent_client.c).
 * CNIBOX_UNPACK_ONLY=1: make sure this version is unpacked, print its directory, exit 0
 * (install-cni runs it so that no pod start pays for the unpack).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#define ZSTDERRORLIB_VISIBILITY
#define ZSTDLIB_VISIBILITY
#define XXH_STATIC_LINKING_ONLY
#include "zstd.h"
#include "common/error_private.c"
#include "common/fse_decompress.c"
#include "common/xxhash.c"
#include "common/zstd_common.c"
#include "common/entropy_common.c"
#include "decompress/huf_decompress.c"
#include "decompress/zstd_ddict.c"
#include "decompress/zstd_decompress.c"
#include "decompress/zstd_decompress_block.c"

#ifndef MAIN_BINARY
#define MAIN_BINARY "cnibox.bin"
#endif
#ifndef LOADER
/* No default: a launcher for one machine naming another's loader execs a file its dist does
 * not carry (build/binary.py passes the target's: ld-linux-x86-64.so.2, ld-linux-aarch64.so.1). */
#error "define LOADER, the glibc loader's file name in the dist"
#endif
#define TRAILER_SIZE 64
#define TRAILER_MAGIC "CNIBOX\x01\n"
#define FORMAT_VERSION 1
#define HASH_LEN 16
#define STALE_TMP_SECONDS 600
#define EXIT_LAUNCHER 127
#define TMPFS_MAGIC_ 0x01021994

static const char *const DEFAULT_ROOTS[] = {
    "/var/lib/cnibox", "/run/cnibox", "/var/tmp/cnibox", "/tmp/cnibox", "/dev/shm/cnibox", NULL,
};

struct trailer {
    uint64_t offset, size, raw_size;
    char hash[HASH_LEN + 1];
};

static void die(const char *fmt, ...) {
    char msg[PATH_MAX + 512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dprintf(2, "cnibox: %s\n", msg);
    _exit(EXIT_LAUNCHER);
}

static uint64_t le64(const unsigned char *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
}

static void path_join(char *out, const char *a, const char *b) {
    if (snprintf(out, PATH_MAX, "%s/%s", a, b) >= PATH_MAX) die("path too long: %s/%s", a, b);
}

/* ---- the trailer ---------------------------------------------------------------------- */

static void read_trailer(int fd, struct trailer *t) {
    struct stat st;
    unsigned char buf[TRAILER_SIZE];
    if (fstat(fd, &st) != 0 || st.st_size < TRAILER_SIZE) die("/proc/self/exe: not a cnibox file");
    if (pread(fd, buf, TRAILER_SIZE, st.st_size - TRAILER_SIZE) != TRAILER_SIZE)
        die("cannot read own trailer: %s", strerror(errno));
    if (memcmp(buf, TRAILER_MAGIC, 8) != 0) die("no payload attached (bad trailer magic)");
    if (le64(buf + 56) != XXH64(buf, 56, 0)) die("corrupt trailer (checksum mismatch)");
    if (le64(buf + 48) != FORMAT_VERSION) die("payload format %llu unsupported",
                                              (unsigned long long)le64(buf + 48));
    t->offset = le64(buf + 8);
    t->size = le64(buf + 16);
    t->raw_size = le64(buf + 24);
    memcpy(t->hash, buf + 32, HASH_LEN);
    t->hash[HASH_LEN] = 0;
    for (int i = 0; i < HASH_LEN; i++)
        if (!strchr("0123456789abcdef", t->hash[i])) die("corrupt trailer (hash)");
    if (t->offset + t->size + TRAILER_SIZE != (uint64_t)st.st_size)
        die("file size %lld does not match its trailer (truncated or appended to?)",
            (long long)st.st_size);
}

/* ---- choosing a root ------------------------------------------------------------------ */

/* Ours, a directory, and not writable by anyone else: nobody can swap a payload under us. */
static int owned_safely(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return 0;
    return S_ISDIR(st.st_mode) && st.st_uid == geteuid() && (st.st_mode & 022) == 0;
}

static const char *exec_allowed(const char *path) {
    struct statvfs vfs;
    if (statvfs(path, &vfs) != 0) return strerror(errno);
    if (vfs.f_flag & ST_RDONLY) return "read-only file system";
    if (vfs.f_flag & ST_NOEXEC) return "mounted noexec";
    return NULL;
}

static int mkdir_parents(const char *path, mode_t mode) {
    char tmp[PATH_MAX];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = 0;
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST) return -1;
        *p = '/';
    }
    if (mkdir(tmp, mode) != 0 && errno != EEXIST) return -1;
    return 0;
}

/* ---- fast path ------------------------------------------------------------------------ */

/* Returns a locked fd on <dir>/.ok, or -1 if the directory is not a complete, live copy. */
static int lock_complete(const char *dir, int check_owner) {
    char ok[PATH_MAX];
    struct stat st;
    path_join(ok, dir, ".ok");
    int fd = open(ok, O_RDONLY | O_NOFOLLOW);
    if (fd < 0) return -1;
    if (check_owner && !owned_safely(dir)) {
        close(fd);
        return -1;
    }
    /* Shared lock, deliberately inherited across exec: cleanup of old versions skips
     * directories someone still holds. A cleanup that won the race unlinked .ok first. */
    if (flock(fd, LOCK_SH) != 0 || fstat(fd, &st) != 0 || st.st_nlink == 0) {
        close(fd);
        return -1;
    }
    return fd;
}

static const char *build_hash = "";

static void run(const char *dir, int argc, char **argv, const char *self) {
    char loader[PATH_MAX], main_binary[PATH_MAX], locale[PATH_MAX];
    path_join(loader, dir, LOADER);
    path_join(main_binary, dir, MAIN_BINARY);
    path_join(locale, dir, "locale");
    const char *only = getenv("CNIBOX_UNPACK_ONLY");
    if (only && !strcmp(only, "1")) {
        dprintf(1, "%s\n", dir);
        _exit(0);
    }
    if (setenv("LOCPATH", locale, 1) != 0 || setenv("CNIBOX_EXE", self, 1) != 0 ||
        setenv("CNIBOX_BUILD", build_hash, 1) != 0)
        die("setenv: %s", strerror(errno));
    char **args = calloc((size_t)argc + 8, sizeof *args);
    if (!args) die("out of memory");
    int n = 0;
    args[n++] = loader;
    args[n++] = "--argv0";
    args[n++] = argc > 0 ? argv[0] : "cnibox";
    args[n++] = "--library-path";
    args[n++] = (char *)dir;
    args[n++] = "--inhibit-cache";
    args[n++] = main_binary;
    for (int i = 1; i < argc; i++) args[n++] = argv[i];
    args[n] = NULL;
    execv(loader, args);
    die("cannot execute %s: %s", loader, strerror(errno));
}

/* ---- extraction ----------------------------------------------------------------------- */

struct zin {
    ZSTD_DCtx *ctx;
    ZSTD_inBuffer in;
    unsigned char *buf;
    size_t len, pos;
    uint64_t produced;
    size_t last;  /* last ZSTD_decompressStream result: 0 once the frame (and checksum) ended */
};

static int zfill(struct zin *z) {
    ZSTD_outBuffer out = {z->buf, ZSTD_DStreamOutSize(), 0};
    while (out.pos == 0) {
        if (z->in.pos == z->in.size && z->last == 0) return -1;
        z->last = ZSTD_decompressStream(z->ctx, &out, &z->in);
        if (ZSTD_isError(z->last)) die("payload: %s", ZSTD_getErrorName(z->last));
        if (out.pos == 0 && z->in.pos == z->in.size) return -1;
    }
    z->len = out.pos;
    z->pos = 0;
    z->produced += out.pos;
    return 0;
}

/* Next up to `want` bytes of the stream; dies on a truncated payload. */
static const unsigned char *zread(struct zin *z, size_t want, size_t *got) {
    if (z->pos == z->len && zfill(z) != 0) die("payload truncated");
    *got = z->len - z->pos < want ? z->len - z->pos : want;
    const unsigned char *p = z->buf + z->pos;
    z->pos += *got;
    return p;
}

static void zread_exact(struct zin *z, void *dst, size_t n) {
    while (n) {
        size_t got;
        const unsigned char *p = zread(z, n, &got);
        memcpy(dst, p, got);
        dst = (char *)dst + got;
        n -= got;
    }
}

/* Relative, and no empty, "." or ".." component: the payload cannot write outside dir. */
static int safe_relative(const char *p) {
    if (!*p || *p == '/') return 0;
    for (const char *s = p;;) {
        const char *end = strchrnul(s, '/');
        size_t len = (size_t)(end - s);
        if (len == 0 || (s[0] == '.' && (len == 1 || (len == 2 && s[1] == '.')))) return 0;
        if (!*end) return 1;
        s = end + 1;
    }
}

static void write_all(int fd, const unsigned char *p, size_t n, const char *path) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) die("%s: %s", path, strerror(errno));
        p += w;
        n -= (size_t)w;
    }
}

static void extract_entry(struct zin *z, const char *dir) {
    unsigned char head[24];
    char rel[PATH_MAX], path[PATH_MAX];
    zread_exact(z, head, sizeof head);
    uint32_t type = head[0] | head[1] << 8 | (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24;
    uint32_t mode = (head[4] | head[5] << 8 | (uint32_t)head[6] << 16) & 0755;
    uint32_t plen = head[8] | head[9] << 8 | (uint32_t)head[10] << 16;
    uint64_t size = le64(head + 16);
    if (plen == 0 || plen >= PATH_MAX - 1) die("payload: bad path length");
    zread_exact(z, rel, plen);
    rel[plen] = 0;
    if (!safe_relative(rel)) die("payload: unsafe path %s", rel);
    path_join(path, dir, rel);
    if (type == 'd') {
        if (mkdir(path, mode | 0700) != 0 && errno != EEXIST) die("%s: %s", path, strerror(errno));
    } else if (type == 'l') {
        char target[PATH_MAX];
        if (size >= PATH_MAX) die("payload: bad link");
        zread_exact(z, target, size);
        target[size] = 0;
        if (symlink(target, path) != 0) die("%s: %s", path, strerror(errno));
    } else if (type == 'f') {
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode | 0600);
        if (fd < 0) die("%s: %s", path, strerror(errno));
        while (size) {
            size_t got;
            const unsigned char *p = zread(z, size > SIZE_MAX ? SIZE_MAX : (size_t)size, &got);
            write_all(fd, p, got, path);
            size -= got;
        }
        if (close(fd) != 0) die("%s: %s", path, strerror(errno));
    } else {
        die("payload: unknown entry type %u", type);
    }
}

static void extract(int self_fd, const struct trailer *t, const char *dir) {
    unsigned char *map = mmap(NULL, t->offset + t->size, PROT_READ, MAP_PRIVATE, self_fd, 0);
    if (map == MAP_FAILED) die("mmap: %s", strerror(errno));
    struct zin z = {0};
    z.ctx = ZSTD_createDCtx();
    z.buf = malloc(ZSTD_DStreamOutSize());
    if (!z.ctx || !z.buf) die("out of memory");
    z.in.src = map + t->offset;
    z.in.size = t->size;
    z.last = 1;
    while (z.produced - (z.len - z.pos) < t->raw_size) extract_entry(&z, dir);
    /* Drive the decoder to the end of the frame: that is where it checks the checksum. */
    while (z.last != 0 && zfill(&z) == 0) die("payload: trailing data");
    if (z.last != 0 || z.produced != t->raw_size) die("payload: size mismatch");
    ZSTD_freeDCtx(z.ctx);
    free(z.buf);
    munmap(map, t->offset + t->size);
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (d) {
        struct dirent *e;
        char child[PATH_MAX];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            path_join(child, path, e->d_name);
            struct stat st;
            if (lstat(child, &st) == 0 && S_ISDIR(st.st_mode))
                remove_tree(child);
            else
                unlink(child);
        }
        closedir(d);
    }
    rmdir(path);
}

static int is_hash(const char *name) {
    if (strlen(name) != HASH_LEN) return 0;
    for (int i = 0; i < HASH_LEN; i++)
        if (!strchr("0123456789abcdef", name[i])) return 0;
    return 1;
}

/* Remove other versions nobody runs (no shared lock on their .ok) and old temp leftovers. */
static void cleanup(const char *root, const char *keep) {
    DIR *d = opendir(root);
    if (!d) return;
    struct dirent *e;
    char path[PATH_MAX], ok[PATH_MAX], doomed[PATH_MAX];
    time_t now = time(NULL);
    while ((e = readdir(d))) {
        path_join(path, root, e->d_name);
        if (is_hash(e->d_name) && strcmp(e->d_name, keep) != 0) {
            path_join(ok, path, ".ok");
            int fd = open(ok, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
            if (fd < 0) continue;
            if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
                snprintf(doomed, sizeof doomed, "%s/.tmp-old-%s-%d", root, e->d_name, getpid());
                if (unlink(ok) == 0 && rename(path, doomed) == 0) remove_tree(doomed);
            }
            close(fd);
        } else if (!strncmp(e->d_name, ".tmp-", 5)) {
            struct stat st;
            if (lstat(path, &st) == 0 && now - st.st_mtime > STALE_TMP_SECONDS) remove_tree(path);
        }
    }
    closedir(d);
}

/* Extract into a temp dir under root and rename it to final; 0 on success or lost race. */
static int install(int self_fd, const struct trailer *t, const char *root, const char *final) {
    char tmp[PATH_MAX], ok[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s/.tmp-%s-XXXXXX", root, t->hash) >= (int)sizeof tmp)
        die("path too long: %s", root);
    if (!mkdtemp(tmp)) return -1;
    extract(self_fd, t, tmp);
    struct statfs fs;
    if (statfs(tmp, &fs) == 0 && fs.f_type != TMPFS_MAGIC_) {
        int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            syncfs(dfd); /* the files must be on disk before .ok says they are complete */
            close(dfd);
        }
    }
    path_join(ok, tmp, ".ok");
    int fd = open(ok, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) die("%s: %s", ok, strerror(errno));
    write_all(fd, (const unsigned char *)t->hash, HASH_LEN, ok);
    close(fd);
    if (chmod(tmp, 0755) != 0) die("%s: %s", tmp, strerror(errno));
    if (rename(tmp, final) != 0) {
        if (errno != EEXIST && errno != ENOTEMPTY) die("rename %s: %s", final, strerror(errno));
        remove_tree(tmp); /* another first start won; use its copy */
    }
    return 0;
}

#include "agent_client.c"

/* ---- main ----------------------------------------------------------------------------- */

static int try_fast(const char *root, const char *hash, int check_owner, char *dir) {
    path_join(dir, root, hash);
    if (check_owner && !owned_safely(root)) return -1;
    return lock_complete(dir, check_owner);
}

int main(int argc, char **argv) {
    char self[PATH_MAX], dir[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n < 0) die("cannot read /proc/self/exe: %s (is /proc mounted?)", strerror(errno));
    self[n] = 0;
    int self_fd = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    if (self_fd < 0) die("cannot open /proc/self/exe: %s", strerror(errno));
    struct trailer t;
    read_trailer(self_fd, &t);
    build_hash = t.hash;
    agent_try(argc, argv, t.hash);

    const char *custom = getenv("CNIBOX_CACHE");
    const char *single[] = {custom, NULL};
    const char *const *roots = custom && *custom ? single : DEFAULT_ROOTS;
    int check_owner = !(custom && *custom);

    for (int attempt = 0; attempt < 3; attempt++) {
        for (int i = 0; roots[i]; i++)
            if (try_fast(roots[i], t.hash, check_owner, dir) >= 0) run(dir, argc, argv, self);

        char tried[2048] = "";
        int installed = 0;
        for (int i = 0; roots[i] && !installed; i++) {
            const char *why = NULL;
            if (mkdir_parents(roots[i], 0755) != 0)
                why = strerror(errno);
            else if (check_owner && !owned_safely(roots[i]))
                why = "not owned by us or writable by others";
            else if ((why = exec_allowed(roots[i])) == NULL && access(roots[i], W_OK | X_OK) != 0)
                why = strerror(errno);
            if (!why) {
                path_join(dir, roots[i], t.hash);
                if (install(self_fd, &t, roots[i], dir) == 0) {
                    cleanup(roots[i], t.hash);
                    installed = 1;
                    break;
                }
                why = strerror(errno);
            }
            size_t used = strlen(tried);
            snprintf(tried + used, sizeof tried - used, "%s%s: %s", used ? "; " : "", roots[i], why);
        }
        if (!installed)
            die("no writable, exec-allowed directory to unpack into (%s); set CNIBOX_CACHE", tried);
    }
    die("the unpacked copy keeps disappearing (concurrent cleanup?)");
    return EXIT_LAUNCHER;
}
