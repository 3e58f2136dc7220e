/*
 * The node agent's client, inside the launcher (#included by launcher.c; docs/agent.md).
 *
 * Invoked as `linkerd-cni` (or `cnibox linkerd-cni`) with an agent answering on
 * $CNIBOX_AGENT_SOCKET (default /var/run/linkerd-cni/agent.sock; set but empty: never), the
 * launcher hands the invocation to the agent and no Python runtime starts in this process.
 * Everything else, and every way this can go wrong before a complete result arrived, ends in
 * agent_fallback(): the one-shot path (exec the bundled loader), exactly as without an agent.
 *
 * Who it talks to (issue 24 #2; docs/agent.md "Threat model"): before a byte of the request
 * or a descriptor leaves this process, the socket's directory must be root's and writable by
 * nobody else (checked on a descriptor; connect() goes through it, /proc/self/fd/N/NAME),
 * and the listening peer must be the agent this launcher expects: uid 0 (SO_PEERCRED), in
 * this process's user namespace, with CAP_NET_ADMIN effective, pinned by a pidfd
 * (agent_peer_expected). Anything else: one-shot, nothing handed over.
 *
 * Request (one stream; the descriptors ride on its first bytes as SCM_RIGHTS):
 *   header  48 bytes: "CBXAGNT2", 16-char build hash (the trailer's), then u32 LE each:
 *           flags (bit per descriptor sent, in this order: 2 caller netns, 4 CNI_NETNS,
 *           8 netlink socket made inside CNI_NETNS; bit 1 was version 1's root directory),
 *           argc, envc, strings length, stdin length, reserved 0
 *   strings argv..., env ("K=V")..., cwd: each NUL-terminated
 *   stdin   the bytes this process read from its stdin (all of it, up to AGENT_MAX_STDIN)
 * Replies (frames: u32 type, u32 length, payload):
 *   ACCEPT   u32 ms: the agent's event loop read the whole request and gives it that long
 *            (its --request-timeout; empty from agents before issue 24 #7). Its absence within
 *            the short deadline means a stuck agent. After it this launcher waits that long
 *            (at most 90 s) plus 5 s for the result, then falls back (agent_total_ms).
 *   FALLBACK reason: the agent asks the caller to run the one-shot path itself
 *   RESULT   u32 exit code, u32 stdout length, u32 stderr length, stdout, stderr
 *   FILE     u32 operation, path (after ACCEPT): the agent asks this process to open, stat or
 *            rotate one file for the request (issue 24: no root directory is handed over,
 *            so whoever answers on the socket gets only files the request named). This
 *            process checks the path (agent_file_allowed), does the operation with flags of
 *            its own, never hands a directory, and answers 32 bytes: u32 errno, u32 st_mode,
 *            u64 st_dev, u64 st_ino, u32 descriptor attached (SCM_RIGHTS), u32 refused.
 * Nothing reaches this process's stdout or stderr before a complete RESULT: up to that point
 * a fallback is always possible, and it is safe because the agent's work until then is reads
 * plus at most one atomic, idempotent firewall transaction per family (docs/agent.md).
 */

#include <poll.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>

#define AGENT_DEFAULT_SOCKET "/var/run/linkerd-cni/agent.sock"
#define AGENT_MAGIC "CBXAGNT2"
#define AGENT_HEADER 48
#define AGENT_MAX_STDIN (1u << 20) /* core/limits.py NETWORK_CONFIG, the plugin's own bound */
#define AGENT_MAX_STRINGS (256u << 10)
#define AGENT_MAX_REPLY (16u << 20)
#define AGENT_ACCEPT_MS 2000
#define AGENT_DEFAULT_REQUEST_MS 60000 /* the agent's --request-timeout default */
#define AGENT_MAX_REQUEST_MS 90000     /* whatever an agent announces: under the kubelet's 2 min */
#define AGENT_MARGIN_MS 5000
#define FRAME_ACCEPT 1
#define FRAME_FALLBACK 2
#define FRAME_RESULT 3
#define FRAME_FILE 4
#define FILE_READ 1
#define FILE_READ_NOFOLLOW 2
#define FILE_APPEND 3
#define FILE_LOCK 4
#define FILE_STAT 5
#define FILE_ROTATE 6
#define FILE_ANSWER 32
#define AGENT_MAX_FILE_PATH 4096
#define AGENT_MAX_FILE_OPS 256
#define AGENT_MAX_GRANTED 8 /* files whose content may name more paths (kubeconfig, ...) */
#define AGENT_MAX_GRANTED_BYTES (1u << 20)
#define AGENT_LOCK_PATH "/run/xtables.lock" /* iptables' default lock: named by no request */
#define FD_CALLER_NET 2u
#define FD_TARGET_NET 4u
#define FD_NETLINK 8u
#define NSFS_MAGIC_ 0x6e736673
#define SO_PEERPIDFD_ 77 /* asm-generic/socket.h, Linux 6.5 */
#define CAP_NET_ADMIN_ 12
#define NETLINK_NETFILTER_ 12

extern char **environ;

static int agent_cap_eff(int proc, int cap);

struct granted {
    char *path;
    unsigned char *content; /* what it names is allowed too (agent_file_allowed) */
    size_t len;
};

struct agent_call {
    int conn;
    int fds[3];
    unsigned flags, nfds;
    unsigned char *stdin_data;
    size_t stdin_len;
    int stdin_read; /* stdin consumed: the fallback must hand it over from memory */
    struct granted granted[AGENT_MAX_GRANTED];
    unsigned ngranted, asked;
};

static long long now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get32(const unsigned char *p) {
    return p[0] | p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static const char *const AGENT_COMMANDS[] = {"ADD", "CHECK", "DEL", "STATUS", "GC", NULL};

/* Whether the agent serves this invocation: the CNI plugin, without arguments (`--help` is
 * not worth a round trip), for a command whose one-shot path reads stdin to its end (so
 * reading it here changes nothing) or for VERSION (which never reads it). 1: read stdin,
 * 2: leave stdin alone, 0: not for the agent. */
static int agent_applies(int argc, char **argv) {
    if (argc < 1) return 0;
    const char *base = strrchr(argv[0], '/');
    base = base ? base + 1 : argv[0];
    if (*base == '-') base++;
    int args = argc - 1;
    if ((!strcmp(base, "cnibox") || !strcmp(base, "cnibox.bin")) && argc > 1 &&
        !strcmp(argv[1], "linkerd-cni"))
        args--;
    else if (strcmp(base, "linkerd-cni") != 0)
        return 0;
    const char *command = getenv("CNI_COMMAND");
    if (args != 0 || !command) return 0;
    if (!strcmp(command, "VERSION")) return 2;
    for (int i = 0; AGENT_COMMANDS[i]; i++)
        if (!strcmp(command, AGENT_COMMANDS[i])) return 1;
    return 0;
}

/* Whether the process at the other end of `fd` is the agent this launcher expects (issue 24
 * #2): uid 0 (SO_PEERCRED), in this process's user namespace, with CAP_NET_ADMIN in its
 * effective set, the least any agent that can serve holds (nf_tables checks it of the
 * sender). A uid-0 process without capabilities, or root in a user namespace of its own,
 * that renamed its socket over the agent's gets nothing: not a byte of the request, not a
 * descriptor. The process is pinned first: SO_PEERPIDFD (Linux 6.5+) names the one that
 * listened; before 6.5, pidfd_open of SO_PEERCRED's pid (a pid reused between the peer's
 * exit and that call is the residual race docs/agent.md names). /proc/PID is opened, then
 * the pidfd asked whether that process still lives: a live pid is not reused, so the
 * directory read afterwards is the pinned process's. */
static int agent_peer_expected(int fd) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != 0 || cred.pid <= 0)
        return 0;
    int pidfd = -1;
    len = sizeof pidfd;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERPIDFD_, &pidfd, &len) != 0) {
        if (errno != ENOPROTOOPT) return 0;
        pidfd = (int)syscall(SYS_pidfd_open, cred.pid, 0);
        if (pidfd < 0) return 0;
    }
    char path[32];
    snprintf(path, sizeof path, "/proc/%d", (int)cred.pid);
    int proc = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    int ok = 0;
    if (proc >= 0 && (syscall(SYS_pidfd_send_signal, pidfd, 0, NULL, 0) == 0 || errno == EPERM)) {
        struct stat theirs, ours;
        ok = fstatat(proc, "ns/user", &theirs, 0) == 0 && stat("/proc/self/ns/user", &ours) == 0 &&
             theirs.st_dev == ours.st_dev && theirs.st_ino == ours.st_ino &&
             agent_cap_eff(proc, CAP_NET_ADMIN_);
    }
    if (proc >= 0) close(proc);
    close(pidfd);
    return ok;
}

/* Whether /proc/PID/status (PID's directory open as `proc`) shows `cap` in CapEff. */
static int agent_cap_eff(int proc, int cap) {
    int fd = openat(proc, "status", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    char buf[8192];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = 0;
    const char *line = strstr(buf, "\nCapEff:\t");
    if (!line) return 0;
    char *end;
    unsigned long long caps = strtoull(line + 9, &end, 16);
    return end != line + 9 && *end == '\n' && (caps >> cap & 1);
}

/* A connected socket, or -1 (no agent, stale socket, full backlog: never wait here; a
 * socket directory or a peer that is not the expected agent's: never talk to it).
 * The directory first (issue 24 #2): owned by root and writable by nobody else (the agent
 * makes it 0700; a kubelet's DirectoryOrCreate makes it 0755), so no other user can put a
 * socket there. It is opened once and the socket reached through that descriptor
 * (/proc/self/fd/N/NAME), so the directory checked is the one connected in even if the path
 * is renamed meanwhile. A uid-0 process can still rename its own socket in: the peer check
 * is what stops it. */
static int agent_connect(const char *path) {
    const char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    char dir[PATH_MAX];
    size_t dir_len = slash ? (size_t)(slash - path) : 0;
    if (!*name || dir_len >= sizeof dir) return -1;
    if (slash) {
        memcpy(dir, path, dir_len);
        dir[dir_len] = 0;
        if (!dir_len) strcpy(dir, "/");
    } else {
        strcpy(dir, ".");
    }
    int dfd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -1;
    struct stat st;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    int fd = -1;
    if (fstat(dfd, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == 0 &&
        !(st.st_mode & (S_IWGRP | S_IWOTH)) &&
        snprintf(addr.sun_path, sizeof addr.sun_path, "/proc/self/fd/%d/%s", dfd, name) <
            (int)sizeof addr.sun_path)
        fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        fd = -1;
    }
    close(dfd);
    if (fd >= 0 && !agent_peer_expected(fd)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* All of stdin, up to the bound; 0 when it fit, -1 when larger (the rest stays unread). */
static int read_stdin(struct agent_call *c) {
    size_t cap = 64 << 10;
    c->stdin_data = malloc(cap);
    if (!c->stdin_data) return -1;
    c->stdin_read = 1;
    for (;;) {
        if (c->stdin_len == cap) {
            if (cap > AGENT_MAX_STDIN) return -1;
            cap *= 2;
            unsigned char *grown = realloc(c->stdin_data, cap);
            if (!grown) return -1;
            c->stdin_data = grown;
        }
        ssize_t n = read(0, c->stdin_data + c->stdin_len, cap - c->stdin_len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && c->stdin_len == 0) {
            c->stdin_read = 0; /* no readable stdin at all (closed, a directory...): leave the */
            return -1;         /* one-shot path the very same fd 0 to fail on in its own words */
        }
        if (n < 0) return -1;
        if (n == 0) return c->stdin_len > AGENT_MAX_STDIN ? -1 : 0;
        c->stdin_len += (size_t)n;
    }
}

static void add_fd(struct agent_call *c, unsigned flag, int fd) {
    if (fd < 0) return;
    c->flags |= flag;
    c->fds[c->nfds++] = fd;
}

/* An nsfs file at CNI_NETNS opened without blocking (a FIFO planted there must not hang
 * us), or -1: then the one-shot path reports the problem in its own words. */
static int open_target_netns(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (fd < 0) return -1;
    struct statfs fs;
    if (fstatfs(fd, &fs) != 0 || fs.f_type != NSFS_MAGIC_) {
        close(fd);
        return -1;
    }
    return fd;
}

/* A netfilter netlink socket created inside the pod's netns, so an nft agent needs no
 * setns (CAP_SYS_ADMIN) of its own. -1 when this process cannot enter it. */
static int netlink_in(int target, int home) {
    if (home < 0 || setns(target, CLONE_NEWNET) != 0) return -1;
    int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER_);
    if (setns(home, CLONE_NEWNET) != 0)
        die("cannot return to the original network namespace: %s", strerror(errno));
    return fd;
}

static int send_all(int fd, const void *buf, size_t len, long long deadline) {
    const char *p = buf;
    while (len) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
            struct pollfd pfd = {fd, POLLOUT, 0};
            long long left = deadline - now_ms();
            if (left <= 0 || poll(&pfd, 1, (int)left) <= 0) return -1;
            continue;
        }
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int recv_all(int fd, void *buf, size_t len, long long deadline) {
    char *p = buf;
    while (len) {
        ssize_t n = recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
            struct pollfd pfd = {fd, POLLIN, 0};
            long long left = deadline - now_ms();
            if (left <= 0) return -1;
            int r = poll(&pfd, 1, (int)left);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) return -1;
            continue;
        }
        if (n <= 0) return -1; /* EOF: the agent or its worker went away */
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int send_request(struct agent_call *c, int argc, char **argv, const char *hash,
                        long long deadline) {
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) cwd[0] = 0;
    size_t strings = strlen(cwd) + 1;
    uint32_t envc = 0;
    for (int i = 0; i < argc; i++) strings += strlen(argv[i]) + 1;
    for (char **e = environ; *e; e++, envc++) strings += strlen(*e) + 1;
    if (strings > AGENT_MAX_STRINGS || envc > 4096 || argc > 256) return -1;
    size_t total = AGENT_HEADER + strings + c->stdin_len;
    unsigned char *buf = malloc(total);
    if (!buf) return -1;
    memcpy(buf, AGENT_MAGIC, 8);
    memcpy(buf + 8, hash, HASH_LEN);
    put32(buf + 24, c->flags);
    put32(buf + 28, (uint32_t)argc);
    put32(buf + 32, envc);
    put32(buf + 36, (uint32_t)strings);
    put32(buf + 40, (uint32_t)c->stdin_len);
    put32(buf + 44, 0);
    unsigned char *p = buf + AGENT_HEADER;
    for (int i = 0; i < argc; i++) p = (unsigned char *)stpcpy((char *)p, argv[i]) + 1;
    for (char **e = environ; *e; e++) p = (unsigned char *)stpcpy((char *)p, *e) + 1;
    p = (unsigned char *)stpcpy((char *)p, cwd) + 1;
    if (c->stdin_len) memcpy(p, c->stdin_data, c->stdin_len);

    /* The descriptors travel with the header; the rest follows as plain bytes. */
    struct iovec iov = {buf, AGENT_HEADER};
    char control[CMSG_SPACE(sizeof(int) * 3)];
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (c->nfds) {
        memset(control, 0, sizeof control);
        msg.msg_control = control;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * c->nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * c->nfds);
        memcpy(CMSG_DATA(cm), c->fds, sizeof(int) * c->nfds);
    }
    ssize_t n;
    do n = sendmsg(c->conn, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    int rc = n == AGENT_HEADER ? send_all(c->conn, buf + n, total - (size_t)n, deadline) : -1;
    free(buf);
    return rc;
}

static void write_fd_all(int fd, const unsigned char *p, size_t n) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* a closed stdout/stderr: the one-shot path would fail alike */
        p += w;
        n -= (size_t)w;
    }
}

/* How long after sending its request this launcher waits for the result, given the
 * deadline the agent announced in ACCEPT (0: an agent that announces none): that deadline,
 * at most AGENT_MAX_REQUEST_MS, plus AGENT_MARGIN_MS (issue 24 #7: a stopped agent held an
 * ADD 124 s, past the kubelet's 2-minute runtime timeout). The agent kills a request at its
 * deadline, so the margin is only ever spent on an agent that cannot (stopped, wedged);
 * then the one-shot path redoes the request, which is safe: the agent's work is reads plus
 * at most one atomic, idempotent transaction per family. */
static long long agent_total_ms(uint32_t announced) {
    long long request = announced ? announced : AGENT_DEFAULT_REQUEST_MS;
    if (request > AGENT_MAX_REQUEST_MS) request = AGENT_MAX_REQUEST_MS;
    return request + AGENT_MARGIN_MS;
}

static int contains(const void *hay, size_t hay_len, const char *path, size_t len) {
    return hay && len <= hay_len && memmem(hay, hay_len, path, len) != NULL;
}

/* Whether the request named `path` (issue 24, "hand over only what a request needs"): it
 * occurs in this invocation's stdin (the network config names the kubeconfig and the
 * log_file), its environment (XTABLES_LOCKFILE), iptables' default lock path, or a file
 * already handed over (the kubeconfig names its token, CA and client files); or it is
 * relative to the directory of such a file, which names the rest (client-go resolves a
 * kubeconfig's relative paths so). A rogue agent gets no other file of this process's. */
static int agent_file_allowed(const struct agent_call *c, const char *path, size_t len) {
    if (contains(c->stdin_data, c->stdin_len, path, len) ||
        contains(AGENT_LOCK_PATH, sizeof AGENT_LOCK_PATH - 1, path, len))
        return 1;
    for (char **e = environ; *e; e++)
        if (contains(*e, strlen(*e), path, len)) return 1;
    for (unsigned i = 0; i < c->ngranted; i++) {
        const struct granted *g = &c->granted[i];
        if (contains(g->content, g->len, path, len)) return 1;
        const char *slash = strrchr(g->path, '/');
        size_t dir = slash ? (size_t)(slash - g->path) + 1 : 0;
        if (dir && len > dir && !memcmp(path, g->path, dir) &&
            contains(g->content, g->len, path + dir, len - dir))
            return 1;
    }
    return 0;
}

/* Keep what a regular file handed for reading says (its first AGENT_MAX_GRANTED_BYTES), for
 * agent_file_allowed. pread: the agent reads the same descriptor from offset 0. */
static void agent_grant(struct agent_call *c, const char *path, int fd, off_t size) {
    if (c->ngranted >= AGENT_MAX_GRANTED) return;
    size_t want = size > (off_t)AGENT_MAX_GRANTED_BYTES ? AGENT_MAX_GRANTED_BYTES : (size_t)size;
    struct granted *g = &c->granted[c->ngranted];
    g->content = malloc(want ? want : 1);
    g->path = strdup(path);
    if (!g->content || !g->path) {
        free(g->content);
        free(g->path);
        return;
    }
    size_t got = 0;
    while (got < want) {
        ssize_t n = pread(fd, g->content + got, want - got, (off_t)got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    g->len = got;
    c->ngranted++;
}

/* One FILE frame: check, do, answer. -1: a malformed frame or a lost connection (the
 * caller falls back). The flags are this process's per operation, never the agent's. */
static int agent_file(struct agent_call *c, const unsigned char *payload, uint32_t len,
                      long long deadline) {
    if (len <= 4 || len > 4 + AGENT_MAX_FILE_PATH) return -1;
    uint32_t op = get32(payload);
    size_t path_len = len - 4;
    char path[AGENT_MAX_FILE_PATH + 1];
    memcpy(path, payload + 4, path_len);
    path[path_len] = 0;
    if (op < FILE_READ || op > FILE_ROTATE || memchr(path, 0, path_len)) return -1;
    uint32_t err = 0, refused = 0;
    struct stat st = {0};
    int fd = -1;
    const int common = O_NONBLOCK | O_NOCTTY | O_CLOEXEC;
    if (++c->asked > AGENT_MAX_FILE_OPS || !agent_file_allowed(c, path, path_len)) {
        refused = 1;
    } else if (op == FILE_STAT) {
        if (lstat(path, &st) != 0) err = (uint32_t)errno;
    } else if (op == FILE_ROTATE) {
        char rotated[AGENT_MAX_FILE_PATH + 3];
        memcpy(rotated, path, path_len);
        memcpy(rotated + path_len, ".1", 3);
        if (rename(path, rotated) != 0) err = (uint32_t)errno;
    } else {
        int flags = op == FILE_READ            ? O_RDONLY | common
                    : op == FILE_READ_NOFOLLOW ? O_RDONLY | O_NOFOLLOW | common
                    : op == FILE_APPEND ? O_WRONLY | O_APPEND | O_CREAT | O_NOFOLLOW | common
                                        : O_RDONLY | O_CREAT | common;
        fd = open(path, flags, 0600);
        if (fd < 0) {
            err = (uint32_t)errno;
        } else if (fstat(fd, &st) != 0 || S_ISDIR(st.st_mode)) {
            close(fd); /* never a directory: a descriptor to resolve any path from */
            fd = -1;
        } else if ((op == FILE_READ || op == FILE_READ_NOFOLLOW) && S_ISREG(st.st_mode)) {
            agent_grant(c, path, fd, st.st_size);
        }
    }
    unsigned char answer[FILE_ANSWER];
    put32(answer, err);
    put32(answer + 4, (uint32_t)st.st_mode);
    put64(answer + 8, (uint64_t)st.st_dev);
    put64(answer + 16, (uint64_t)st.st_ino);
    put32(answer + 24, fd >= 0);
    put32(answer + 28, refused);
    struct iovec iov = {answer, sizeof answer};
    char control[CMSG_SPACE(sizeof(int))];
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    if (fd >= 0) {
        memset(control, 0, sizeof control);
        msg.msg_control = control;
        msg.msg_controllen = sizeof control;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    }
    ssize_t n;
    for (;;) {
        n = sendmsg(c->conn, &msg, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) {
            struct pollfd pfd = {c->conn, POLLOUT, 0};
            long long left = deadline - now_ms();
            if (left > 0 && poll(&pfd, 1, (int)left) > 0) continue;
        }
        break;
    }
    if (fd >= 0) close(fd);
    if (n <= 0) return -1;
    return send_all(c->conn, answer + n, sizeof answer - (size_t)n, deadline);
}

/* The agent's answer: returns only if the caller must fall back; a RESULT exits here. */
static void await_reply(struct agent_call *c) {
    const char *timeouts = getenv("CNIBOX_AGENT_TIMEOUTS"); /* "ACCEPT_MS,TOTAL_MS" */
    long long accept_ms = AGENT_ACCEPT_MS, total_ms = 0;
    if (timeouts && *timeouts) {
        char *end;
        long long a = strtoll(timeouts, &end, 10), t = *end == ',' ? strtoll(end + 1, NULL, 10) : 0;
        if (a > 0) accept_ms = a;
        if (t > 0 && t < AGENT_MAX_REQUEST_MS + AGENT_MARGIN_MS) total_ms = t;
    }
    long long start = now_ms(), deadline = start + accept_ms;
    int accepted = 0;
    for (;;) {
        unsigned char head[8];
        if (recv_all(c->conn, head, sizeof head, deadline) != 0) return;
        uint32_t type = get32(head), len = get32(head + 4);
        if (type == FRAME_ACCEPT && (len == 0 || len == 4) && !accepted) {
            unsigned char announced[4] = {0};
            if (len && recv_all(c->conn, announced, 4, deadline) != 0) return;
            accepted = 1;
            deadline = start + (total_ms ? total_ms : agent_total_ms(get32(announced)));
            continue;
        }
        if (type == FRAME_FILE && accepted && len <= 4 + AGENT_MAX_FILE_PATH) {
            unsigned char payload[4 + AGENT_MAX_FILE_PATH];
            if (recv_all(c->conn, payload, len, deadline) != 0 ||
                agent_file(c, payload, len, deadline) != 0)
                return;
            continue;
        }
        if (type != FRAME_RESULT || !accepted || len < 12 || len > AGENT_MAX_REPLY) return;
        unsigned char *body = malloc(len);
        if (!body || recv_all(c->conn, body, len, deadline) != 0) return;
        uint32_t code = get32(body), out_len = get32(body + 4), err_len = get32(body + 8);
        if ((uint64_t)out_len + err_len + 12 != len) return;
        /* The point of no return: from here on this process is the plugin's result. */
        write_fd_all(2, body + 12 + out_len, err_len);
        write_fd_all(1, body + 12, out_len);
        _exit((int)(code & 0xff));
    }
}

static void agent_release(struct agent_call *c) {
    for (unsigned i = 0; i < c->nfds; i++) close(c->fds[i]);
    c->nfds = 0;
    for (unsigned i = 0; i < c->ngranted; i++) {
        free(c->granted[i].path);
        free(c->granted[i].content);
    }
    c->ngranted = 0;
    if (c->conn >= 0) close(c->conn);
    c->conn = -1;
}

/* Give the bytes already read from stdin back to the one-shot path as its stdin. */
static void restore_stdin(struct agent_call *c) {
    if (!c->stdin_read) return;
    int fd = memfd_create("cnibox-stdin", MFD_CLOEXEC);
    if (fd < 0) die("memfd_create: %s", strerror(errno));
    write_all(fd, c->stdin_data, c->stdin_len, "stdin copy");
    /* A stdin larger than the bound: the rest still waits on fd 0. */
    unsigned char chunk[65536];
    ssize_t n;
    while ((n = read(0, chunk, sizeof chunk)) != 0) {
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) break;
        write_all(fd, chunk, (size_t)n, "stdin copy");
    }
    if (lseek(fd, 0, SEEK_SET) != 0 || dup2(fd, 0) != 0) die("stdin copy: %s", strerror(errno));
    close(fd);
    free(c->stdin_data);
    c->stdin_data = NULL;
}

/* Serve this invocation through the agent if one answers; returns when the caller must run
 * the one-shot path (with stdin restored). */
static void agent_try(int argc, char **argv, const char *hash) {
    int kind = agent_applies(argc, argv);
    if (!kind) return;
    const char *path = getenv("CNIBOX_AGENT_SOCKET");
    if (path && !*path) return;
    struct agent_call c = {.conn = agent_connect(path ? path : AGENT_DEFAULT_SOCKET)};
    if (c.conn < 0) return;
    long long deadline = now_ms() + AGENT_ACCEPT_MS;
    if (kind == 2 || read_stdin(&c) == 0) {
        int home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
        add_fd(&c, FD_CALLER_NET, home);
        const char *netns = getenv("CNI_NETNS");
        const char *command = getenv("CNI_COMMAND");
        int target = -1, usable = 1;
        if (netns && *netns) {
            target = open_target_netns(netns);
            usable = target >= 0;
        }
        add_fd(&c, FD_TARGET_NET, target);
        if (target >= 0 && command && (!strcmp(command, "ADD") || !strcmp(command, "CHECK")))
            add_fd(&c, FD_NETLINK, netlink_in(target, home));
        if (usable && send_request(&c, argc, argv, hash, deadline) == 0) await_reply(&c);
    }
    agent_release(&c);
    restore_stdin(&c);
}
