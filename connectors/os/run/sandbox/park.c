/* Parked sandboxes from their start, in C: `sensorium-exec-stage park`.
 *
 * The zygote used to park a sandbox by cloning itself (a Python process) into the
 * new namespaces; the copy of its page tables, the copy-on-write faults of the
 * child's Python setting up its mounts, and the teardown of that heap at exec were
 * the largest cost per directive left (bench/RESULTS.md). Now the zygote starts this
 * program once (posix_spawn: nothing of the zygote is copied) and asks it for each
 * parked sandbox:
 *
 *   park (this process, outside, for the zygote's life): reads a shape with the
 *     init's and the target's sockets on fd 3, clones the init with CLONE_PARENT
 *     into the shape's namespaces (so the init is the zygote's child, as before: the
 *     zygote reaps it and holds a pidfd of it, and it dies with the zygote), writes
 *     its user namespace's id maps exactly as stage.launch did, lets it go, and
 *     answers "<pid>" (or "error <what>").
 *   init (pid 1 of the namespace): makes the mounts as stage.setup_namespace does,
 *     forks the target, which waits as the exec stage (stage_run) for its plan on
 *     its socket, and supervises it as reaper.c does, once the report pipe comes
 *     on its own socket.
 *
 * The shape's records (park.py):
 *   P_SHAPE "=QIIIII": CLONE_NEW* flags, user namespace, a fresh /proc, uid, gid,
 *                      root maps (0 and the action's ids) instead of own ids
 *   P_MOUNT "=IIqqQqII" kind, mode, uid, gid (-1: none), size, inodes (-1: none),
 *                      read-only, target length; then the target, then the source.
 * Only tmpfs, bind and mkdir: a shape that holds anything of one run (overlays,
 * exported mounts, egress) is never parked. Any failure in the init ends it before
 * the target exists; the zygote then finds it dead and takes the cold path, which
 * says why.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef SYS_mount_setattr
#define SYS_mount_setattr 442
#endif
#define ATTR_RDONLY 0x1ULL
#define AT_RECURSIVE_ 0x8000
#define MAX_SHAPE (64 * 1024)
#define MAX_MOUNTS 256
#define FD_CTL 3
#define FD_TCTL 4
#define FD_ZYGOTE 3  /* `park`'s own socket; its inits get theirs at 3 and 4 */

enum { P_SHAPE = 1, P_MOUNT };
enum { M_TMPFS, M_BIND, M_MKDIR };

struct attr { uint64_t set, clr, propagation, userns_fd; };
struct mnt {
    uint32_t kind, mode, read_only;
    int64_t uid, gid, inodes;
    uint64_t size;
    const char *target, *source;
    int src;
};

void close_from(unsigned lo, unsigned hi);          /* exec_stage.c */
int stage_run(int wait_go);                          /* exec_stage.c */
void reaper_arm(void);                               /* reaper.c */
int reap_target(pid_t target, int err_fd, int ctl_fd);  /* reaper.c */

static unsigned char shape_buf[MAX_SHAPE + 1];
static struct {
    uint64_t flags;
    uint32_t userns, proc, uid, gid, root_maps;
} shape;
static struct mnt mounts[MAX_MOUNTS];
static int nmounts;

static void answer(const char *text) {
    if (send(FD_ZYGOTE, text, strlen(text), MSG_NOSIGNAL)) {}
}

/* The shape's records into ``shape`` and ``mounts``; strings stay NUL-terminated in
 * place (each is followed by the next record's header, saved before it is cut). */
static int parse(size_t got) {
    int seen = 0;
    for (size_t at = 0; at < got;) {
        uint32_t tag, len;
        if (got - at < 8)
            return -1;
        memcpy(&tag, shape_buf + at, 4);
        memcpy(&len, shape_buf + at + 4, 4);
        at += 8;
        if (got - at < len)
            return -1;
        unsigned char *d = shape_buf + at;
        at += len;
        if (tag == P_SHAPE && len == 28) {
            memcpy(&shape.flags, d, 8);
            memcpy(&shape.userns, d + 8, 20);
            seen = 1;
        } else if (tag == P_MOUNT && len >= 48 && nmounts < MAX_MOUNTS) {
            struct mnt *m = &mounts[nmounts++];
            uint32_t tlen;
            memcpy(&m->kind, d, 4);
            memcpy(&m->mode, d + 4, 4);
            memcpy(&m->uid, d + 8, 8);
            memcpy(&m->gid, d + 16, 8);
            memcpy(&m->size, d + 24, 8);
            memcpy(&m->inodes, d + 32, 8);
            memcpy(&m->read_only, d + 40, 4);
            memcpy(&tlen, d + 44, 4);
            /* Target then source, each NUL-terminated by the sender, both inside the
             * record and without a NUL before their end. */
            if (tlen == 0 || tlen >= len - 48 || m->kind > M_MKDIR)
                return -1;
            m->target = (const char *)d + 48;
            m->source = (const char *)d + 48 + tlen;
            if (d[48 + tlen - 1] != 0 || d[len - 1] != 0 || strlen(m->target) != tlen - 1 ||
                strlen(m->source) != len - 48 - tlen - 1)
                return -1;
            m->src = -1;
        } else {
            return -1;
        }
    }
    /* Only a shape with its own PID namespace: its init's kill(-1) must reach nothing
     * but the action (pool.shape_of never parks another). */
    return seen && (shape.flags & CLONE_NEWPID) ? 0 : -1;
}

static int write_file(pid_t pid, const char *name, const char *text) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, name);
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, text, strlen(text));
    int saved = errno;
    close(fd);
    errno = saved;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

/* stage.launch's maps: root and the action's ids, each to itself, for a root zygote;
 * else only its own ids, with setgroups denied as the kernel requires. */
static int write_maps(pid_t pid, char *why, size_t size) {
    char uids[64], gids[64];
    if (shape.root_maps) {
        if (shape.uid == 0)
            snprintf(uids, sizeof uids, "0 0 1\n");
        else
            snprintf(uids, sizeof uids, "0 0 1\n%u %u 1\n", shape.uid, shape.uid);
        if (shape.gid == 0)
            snprintf(gids, sizeof gids, "0 0 1\n");
        else
            snprintf(gids, sizeof gids, "0 0 1\n%u %u 1\n", shape.gid, shape.gid);
    } else {
        if (write_file(pid, "setgroups", "deny") < 0) {
            snprintf(why, size, "error namespaces: setgroups: %s", strerror(errno));
            return -1;
        }
        snprintf(uids, sizeof uids, "%u %u 1", shape.uid, shape.uid);
        snprintf(gids, sizeof gids, "%u %u 1", shape.gid, shape.gid);
    }
    if (write_file(pid, "uid_map", uids) < 0 || write_file(pid, "gid_map", gids) < 0) {
        snprintf(why, size, "error namespaces: uid_map of the user namespace: %s",
                 strerror(errno));
        return -1;
    }
    return 0;
}

/* stage.setup_namespace for a parked shape, step for step. */
static int setup(void) {
    if (!(shape.flags & CLONE_NEWNS))
        return 0;
    if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
        return -1;
    for (int i = 0; i < nmounts; i++)
        if (mounts[i].kind == M_BIND &&
            (mounts[i].src = open(mounts[i].source, O_PATH | O_CLOEXEC)) < 0)
            return -1;
    /* The host tree read-only; only the shape's own mounts, made on top, are written. */
    struct attr ro = {.set = ATTR_RDONLY};
    if (syscall(SYS_mount_setattr, AT_FDCWD, "/", AT_RECURSIVE_, &ro, sizeof ro) < 0)
        return -1;
    if ((shape.flags & CLONE_NEWPID) && shape.proc &&
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
        return -1;
    for (int i = 0; i < nmounts; i++) {
        struct mnt *m = &mounts[i];
        if (m->kind == M_TMPFS) {
            char opts[160];
            int n = snprintf(opts, sizeof opts, "size=%llu,mode=%o",
                             (unsigned long long)(m->size > 4096 ? m->size : 4096), m->mode);
            if (m->uid >= 0)
                n += snprintf(opts + n, sizeof opts - (size_t)n, ",uid=%lld", (long long)m->uid);
            if (m->gid >= 0)
                n += snprintf(opts + n, sizeof opts - (size_t)n, ",gid=%lld", (long long)m->gid);
            if (m->inodes >= 0)
                snprintf(opts + n, sizeof opts - (size_t)n, ",nr_inodes=%lld",
                         (long long)m->inodes);
            unsigned long flags = MS_NOSUID | MS_NODEV | (m->read_only ? MS_RDONLY : 0);
            if (mount("tmpfs", m->target, "tmpfs", flags, opts) < 0)
                return -1;
        } else if (m->kind == M_BIND) {
            /* Through the fd opened before any mount: the source may be hidden now. */
            char from[48];
            snprintf(from, sizeof from, "/proc/self/fd/%d", m->src);
            if (mount(from, m->target, NULL, MS_BIND, NULL) < 0)
                return -1;
            unsigned long flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV |
                                  (m->read_only ? MS_RDONLY : 0);
            if (mount(NULL, m->target, NULL, flags, NULL) < 0)
                return -1;
        } else {
            if (mkdir(m->target, m->mode) < 0)
                return -1;
            if (m->uid >= 0 && m->gid >= 0 &&
                chown(m->target, (uid_t)m->uid, (gid_t)m->gid) < 0)
                return -1;
        }
    }
    for (int i = 0; i < nmounts; i++)
        if (mounts[i].src >= 0)
            close(mounts[i].src);
    return 0;
}

/* pid 1 of the namespace: fds 3 (ctl), 4 (tctl), ``go`` (read end). Never returns. */
static int init_main(int go) {
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    reaper_arm();
    char byte;
    ssize_t n;
    do
        n = read(go, &byte, 1);
    while (n < 0 && errno == EINTR);
    if (n != 1)
        _exit(1);  /* no ids were mapped: nothing privileged may run */
    close(go);
    if (setup() < 0)
        _exit(1);
    int err[2];
    if (pipe2(err, O_CLOEXEC) < 0)
        _exit(1);
    pid_t target = fork();
    if (target < 0)
        _exit(1);
    if (target == 0) {
        /* The exec stage, already in place: its plan socket at 3, the error pipe at 4. */
        signal(SIGTERM, SIG_DFL);
        if (dup2(FD_TCTL, 3) < 0 || dup2(err[1], 4) < 0)
            _exit(1);
        close_from(5, ~0U);
        return stage_run(0);
    }
    close(FD_TCTL);
    close(err[1]);
    return reap_target(target, err[0], FD_CTL);
}

/* One parked sandbox of the shape in shape_buf[0, got): the init's pid, or -1 with
 * ``why`` said. ``ctl`` and ``tctl`` are the init's and the target's sockets. */
static long park_one(size_t got, int ctl, int tctl, char *why, size_t size) {
    memset(&shape, 0, sizeof shape);
    nmounts = 0;
    if (parse(got) < 0) {
        snprintf(why, size, "error park: a bad shape");
        return -1;
    }
    int go[2];
    if (pipe2(go, O_CLOEXEC) < 0) {
        snprintf(why, size, "error park: pipe: %s", strerror(errno));
        return -1;
    }
    uint64_t flags = shape.flags | (shape.userns ? CLONE_NEWUSER : 0);
    /* CLONE_PARENT: the init is the zygote's child, not ours. With a null stack and
     * no *_TID or SETTLS flag, clone(2) is a fork into the new namespaces. */
    long pid = syscall(SYS_clone, (unsigned long)(flags | CLONE_PARENT | SIGCHLD), 0, 0, 0, 0);
    if (pid < 0) {
        snprintf(why, size, "error namespaces: clone: %s", strerror(errno));
        close(go[0]);
        close(go[1]);
        return -1;
    }
    if (pid == 0) {
        /* Only its own sockets at 3 and 4 and the go pipe at 5: not the zygote's. */
        int hi[3] = {fcntl(ctl, F_DUPFD, 10), fcntl(tctl, F_DUPFD, 10), fcntl(go[0], F_DUPFD, 10)};
        if (hi[0] < 0 || hi[1] < 0 || hi[2] < 0 || dup2(hi[0], FD_CTL) < 0 ||
            dup2(hi[1], FD_TCTL) < 0 || dup2(hi[2], 5) < 0)
            _exit(1);
        close_from(6, ~0U);
        return init_main(5);
    }
    close(go[0]);
    if (shape.userns && write_maps((pid_t)pid, why, size) < 0) {
        close(go[1]);  /* the init, never let go, reads EOF and exits */
        return -1;
    }
    ssize_t n = write(go[1], "g", 1);
    close(go[1]);
    if (n != 1) {
        snprintf(why, size, "error park: the init is gone");
        return -1;
    }
    return pid;
}

/* `park`: the zygote's one process for parking sandboxes, for its whole life. fd 3 is
 * its socket: each message is a shape with two fds (the init's and the target's
 * sockets); each answer is "<pid>" or "error <what>". EOF: the zygote is gone. */
int park_main(int argc, char **argv) {
    (void)argc;
    (void)argv;
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    close_from(FD_CTL + 1, ~0U);
    /* 0-2 taken, so no socket or pipe of ours lands there and outlives its use. */
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && open("/dev/null", O_RDWR) < 0)
            _exit(1);
    for (;;) {
        union {
            char buf[CMSG_SPACE(sizeof(int) * 2)];
            struct cmsghdr align;
        } cbuf;
        struct iovec iov = {shape_buf, MAX_SHAPE + 1};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
                            .msg_controllen = sizeof cbuf.buf};
        ssize_t got;
        do
            got = recvmsg(FD_ZYGOTE, &mh, MSG_CMSG_CLOEXEC);
        while (got < 0 && errno == EINTR);
        if (got <= 0)
            _exit(0);
        int fds[2], nfds = 0;
        for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
            if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
                continue;
            int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
            for (int i = 0; i < n; i++) {
                int fd;
                memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
                if (nfds < 2)
                    fds[nfds++] = fd;
                else
                    close(fd);
            }
        }
        char said[256];
        long pid = -1;
        if (nfds != 2 || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) || got > MAX_SHAPE)
            snprintf(said, sizeof said, "error park: a bad shape");
        else
            pid = park_one((size_t)got, fds[0], fds[1], said, sizeof said);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        if (pid > 0)
            snprintf(said, sizeof said, "%ld", pid);
        answer(said);
    }
}
