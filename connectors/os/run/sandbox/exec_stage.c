/* The exec stage of a parked sandbox: the last process between a plan and the action.
 *
 * A parked target (pool.py) execs this program while it waits, off any directive's
 * path, so that what runs between "here is your plan" and the action's exec is a
 * few dozen system calls instead of an interpreter: no copy-on-write faults of a
 * forked Python heap, no teardown of one at exec (execstage.py says what it saves).
 * It applies, in stage.run_target's order and with its error lines, what the zygote
 * worked out: the cgroup, default signals, a new session, fds 0-2 and the plan's
 * extras, cwd, rlimits, ids, Landlock, seccomp; then it execs the action.
 *
 * fd 3: a SOCK_SEQPACKET from the zygote; one message (records, below) with the
 *       plan's fds; EOF means the sandbox was discarded.
 * fd 4: the init's error pipe. Moved close-on-exec, so the init reads EOF exactly
 *       when the action's exec succeeds, or this stage's line when anything failed.
 * fd 5: the init's go pipe. The init starts this stage before it builds the mounts
 *       (its own path may be hidden after them, a fresh /proc is noexec); nothing is
 *       read or applied before the init's one byte that the namespace is ready. EOF:
 *       it never will be (the init failed and reports why), so nothing ran.
 *
 * No policy here: every value comes from the zygote, which built it from the Plan.
 * The same program, run as `park`, starts a parked sandbox from its start (park.c:
 * its target runs stage_run without the go pipe, the namespace being ready), and
 * as `reap <pid>` is the init of one the Python park started (reaper.c).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/filter.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MAX_MSG (1 << 20)
#define MAX_FDS 8
#define MAX_ITEMS 65536
#define FD_FLOOR 72    /* received fds moved here first (past the error pipe and the
                          * binary beside it): nothing below is clobbered */
#define ERR_FD 64      /* stage.py's _ERR_FD_MIN */
/* execstage.py's STAGE_VERSION: the zygote uses a stage only if it answers this. */
#define STAGE_VERSION 6

enum tag {
    T_EXE = 1, T_ARG, T_ENV, T_CWD, T_RLIMIT, T_IDS, T_FD,
    T_LL_RULESET, T_LL_PATH, T_LL_PORT, T_SECCOMP, T_PROBE,
};
enum role { R_STDOUT, R_STDERR, R_EXEC, R_HAND, R_BINARY, R_CGROUP, R_GATE, R_COUNT };

#define LL_CREATE 444
#define LL_ADD_RULE 445
#define LL_RESTRICT 446
#define LL_RULE_PATH_BENEATH 1
#define LL_RULE_NET_PORT 2
#define LL_CONNECT_TCP (1ULL << 1)
/* Rights a rule on a non-directory may carry (landlock.FILE_RIGHTS). */
#define LL_FILE_RIGHTS ((1ULL << 0) | (1ULL << 1) | (1ULL << 2) | (1ULL << 14) | (1ULL << 15))

struct ll_ruleset { uint64_t fs, net, scoped; };
struct ll_path { uint64_t access; int32_t fd; } __attribute__((packed));
struct ll_port { uint64_t access, port; };

static int err_fd = 4;
static char step[4200] = "setup";

__attribute__((noreturn)) static void fail(int code, const char *what) {
    char line[4600];
    int n;
    if (what)
        n = snprintf(line, sizeof line, "%s: %s: %s [errno %d]", step, what, strerror(code), code);
    else
        n = snprintf(line, sizeof line, "%s: %s [errno %d]", step, strerror(code), code);
    if (n > 0 && write(err_fd, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1)) {}
    _exit(127);
}

void close_from(unsigned lo, unsigned hi) {  /* [lo, hi]; ~0U: every fd from lo */
    if (lo > hi)
        return;
    if (syscall(SYS_close_range, lo, hi, 0) == 0)
        return;
    long top = sysconf(_SC_OPEN_MAX);
    for (unsigned fd = lo; fd <= hi && (long)fd < (top > 0 ? top : 65536); fd++)
        close((int)fd);
}

struct plan {
    char *exe, *cwd;
    char **argv, **envp;
    int argc, envc;
    int fd[R_COUNT];
    int has_ids;
    uint32_t uid, gid;
    int has_ll;
    struct ll_ruleset ll;
    uint32_t ll_size;
    struct sock_fprog seccomp;
};

static char *dupstr(const unsigned char *p, uint32_t len) {
    char *s = malloc((size_t)len + 1);
    if (!s)
        fail(ENOMEM, NULL);
    memcpy(s, p, len);
    s[len] = 0;
    if (strlen(s) != len)  /* a NUL inside: never silently shortened */
        fail(EINVAL, "a string of the plan holds a NUL byte");
    return s;
}

int reaper_main(int argc, char **argv);  /* reaper.c: "reap <target pid>" */
int park_main(int argc, char **argv);    /* park.c: "park", a parked sandbox from its start */

/* The stage itself: fds 3 (plan), 4 (error pipe) and, with ``wait_go``, 5 (go pipe);
 * every other fd above 2 is closed already. Execs the action or exits. */
int stage_run(int wait_go) {
    /* The error pipe first, close-on-exec: from here on every failure is reported. */
    int e = fcntl(4, F_DUPFD_CLOEXEC, ERR_FD);
    if (e < 0)
        fail(errno, "moving the error pipe");  /* still on fd 4 */
    close(4);
    err_fd = e;
    if (wait_go) {
        char go;
        ssize_t said;
        do
            said = read(5, &go, 1);
        while (said < 0 && errno == EINTR);
        if (said != 1)
            _exit(0);  /* the namespace was never finished: nothing ran, the init says why */
        close(5);
    }

    unsigned char *msg = malloc(MAX_MSG);
    if (!msg)
        fail(ENOMEM, NULL);
    union {
        char buf[CMSG_SPACE(sizeof(int) * MAX_FDS)];
        struct cmsghdr align;
    } cbuf;
    struct iovec iov = {msg, MAX_MSG};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
                        .msg_controllen = sizeof cbuf.buf};
    ssize_t got;
    do
        got = recvmsg(3, &mh, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    if (got < 0)
        fail(errno, "reading the plan");
    if (got == 0)
        _exit(0);  /* discarded, or the zygote is gone: nothing ran, nothing to say */
    if (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))
        fail(EMSGSIZE, "the plan did not fit");
    close(3);

    int fds[MAX_FDS], nfds = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < n && nfds < MAX_FDS; i++) {
            int raw;
            memcpy(&raw, CMSG_DATA(c) + i * sizeof(int), sizeof raw);
            int moved = fcntl(raw, F_DUPFD_CLOEXEC, FD_FLOOR);
            if (moved < 0)
                fail(errno, "moving the plan's fds");
            close(raw);
            fds[nfds++] = moved;
        }
    }

    struct plan p;
    memset(&p, 0, sizeof p);
    for (int r = 0; r < R_COUNT; r++)
        p.fd[r] = -1;
    p.argv = calloc(MAX_ITEMS + 1, sizeof(char *));
    p.envp = calloc(MAX_ITEMS + 1, sizeof(char *));
    char **ll_paths = calloc(MAX_ITEMS, sizeof(char *));
    uint64_t *ll_access = calloc(MAX_ITEMS, sizeof(uint64_t));
    uint64_t *ports = calloc(MAX_ITEMS, sizeof(uint64_t));
    int rl_res[16];
    uint64_t rl_val[16];
    int nrl = 0, npaths = 0, nports = 0;
    if (!p.argv || !p.envp || !ll_paths || !ll_access || !ports)
        fail(ENOMEM, NULL);

    for (size_t at = 0; at < (size_t)got;) {
        uint32_t tag, len;
        if ((size_t)got - at < 8)
            fail(EINVAL, "a truncated plan");
        memcpy(&tag, msg + at, 4);
        memcpy(&len, msg + at + 4, 4);
        at += 8;
        if ((size_t)got - at < len)
            fail(EINVAL, "a truncated plan");
        const unsigned char *d = msg + at;
        at += len;
        switch (tag) {
        case T_EXE: p.exe = dupstr(d, len); break;
        case T_CWD: p.cwd = dupstr(d, len); break;
        case T_ARG:
            if (p.argc >= MAX_ITEMS) fail(E2BIG, "too many arguments");
            p.argv[p.argc++] = dupstr(d, len);
            break;
        case T_ENV:
            if (p.envc >= MAX_ITEMS) fail(E2BIG, "too many environment variables");
            p.envp[p.envc++] = dupstr(d, len);
            break;
        case T_RLIMIT:
            if (len != 12 || nrl >= 16) fail(EINVAL, "a bad rlimit");
            memcpy(&rl_res[nrl], d, 4);
            memcpy(&rl_val[nrl], d + 4, 8);
            nrl++;
            break;
        case T_IDS:
            if (len != 8) fail(EINVAL, "bad ids");
            memcpy(&p.uid, d, 4);
            memcpy(&p.gid, d + 4, 4);
            p.has_ids = 1;
            break;
        case T_FD: {
            int32_t role, index;
            if (len != 8) fail(EINVAL, "a bad fd");
            memcpy(&role, d, 4);
            memcpy(&index, d + 4, 4);
            if (role < 0 || role >= R_COUNT || index < 0 || index >= nfds)
                fail(EBADF, "a plan fd that was not sent");
            p.fd[role] = fds[index];
            break;
        }
        case T_LL_RULESET:
            if (len != 28) fail(EINVAL, "a bad Landlock ruleset");
            memcpy(&p.ll, d, 24);
            memcpy(&p.ll_size, d + 24, 4);
            if (p.ll_size > sizeof p.ll) fail(EINVAL, "a bad Landlock ruleset");
            p.has_ll = 1;
            break;
        case T_LL_PATH:
            if (len < 8 || npaths >= MAX_ITEMS) fail(EINVAL, "a bad Landlock path");
            memcpy(&ll_access[npaths], d, 8);
            ll_paths[npaths++] = dupstr(d + 8, len - 8);
            break;
        case T_LL_PORT:
            if (len != 8 || nports >= MAX_ITEMS) fail(EINVAL, "a bad Landlock port");
            memcpy(&ports[nports++], d, 8);
            break;
        case T_PROBE: {  /* the zygote asks which stage this is, at its start */
            char line[32];
            int n = snprintf(line, sizeof line, "probe %d", STAGE_VERSION);
            _exit(write(err_fd, line, (size_t)n) == n ? 0 : 1);
        }
        case T_SECCOMP:
            if (len == 0 || len % sizeof(struct sock_filter) || len / sizeof(struct sock_filter) > 0xffff)
                fail(EINVAL, "seccomp: not a BPF program");
            p.seccomp.len = (unsigned short)(len / sizeof(struct sock_filter));
            p.seccomp.filter = malloc(len);
            if (!p.seccomp.filter) fail(ENOMEM, NULL);
            memcpy(p.seccomp.filter, d, len);
            break;
        default:
            fail(EINVAL, "an unknown plan record");
        }
    }
    if (!p.exe || !p.cwd || !p.has_ids || p.fd[R_STDOUT] < 0 || p.fd[R_STDERR] < 0)
        fail(EINVAL, "an incomplete plan");

    if (p.fd[R_GATE] >= 0) {
        /* Nothing of the plan is applied before the connector's start row is on disk. */
        strcpy(step, "gate");
        char go;
        ssize_t said;
        do
            said = read(p.fd[R_GATE], &go, 1);
        while (said < 0 && errno == EINTR);
        if (said != 1)
            fail(ECANCELED, "the connector withdrew this start before it began");
        close(p.fd[R_GATE]);
        strcpy(step, "setup");
    }
    if (p.fd[R_CGROUP] >= 0) {
        /* Into the action's cgroup while still privileged; refused, the connector
         * finds it empty and accounts by rusage instead. */
        if (write(p.fd[R_CGROUP], "0", 1) < 0) {}
    }
    /* Ignored signals survive exec: the action gets every default. Through the raw
     * call: glibc's wrapper refuses its own two (32, 33), which posix_spawn leaves
     * ignored. All zeroes is SIG_DFL in every architecture's struct layout. */
    for (int s = 1; s < NSIG; s++) {
        unsigned long ksa[8] = {0};
        if (s != SIGKILL && s != SIGSTOP)
            syscall(SYS_rt_sigaction, s, ksa, NULL, (size_t)((NSIG - 1) / 8));
    }
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (setsid() < 0)
        fail(errno, NULL);

    strcpy(step, "stdio");
    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (devnull < 0)
        fail(errno, "/dev/null");
    if (dup2(devnull, 0) < 0 || dup2(p.fd[R_STDOUT], 1) < 0 || dup2(p.fd[R_STDERR], 2) < 0)
        fail(errno, NULL);
    unsigned keep = 3;
    if (p.fd[R_EXEC] >= 0) {
        if (dup2(p.fd[R_EXEC], 3) < 0) fail(errno, NULL);
        keep = 4;
    }
    if (p.fd[R_HAND] >= 0) {
        if (dup2(p.fd[R_HAND], (int)keep) < 0) fail(errno, NULL);
        keep++;
    }
    /* Everything else goes, the error pipe and the pinned binary (close-on-exec) kept. */
    int bin = p.fd[R_BINARY];
    if (bin >= 0) {  /* just above the error pipe, so one sweep leaves exactly these */
        int moved = fcntl(bin, F_DUPFD_CLOEXEC, err_fd + 1);
        if (moved < 0)
            fail(errno, NULL);
        bin = moved;
    }
    close_from(keep, (unsigned)err_fd - 1);
    close_from((unsigned)err_fd + 1, bin >= 0 ? (unsigned)bin - 1 : ~0U);
    if (bin >= 0)
        close_from((unsigned)bin + 1, ~0U);

    snprintf(step, sizeof step, "cwd %s", p.cwd);
    if (chdir(p.cwd) < 0)
        fail(errno, NULL);

    strcpy(step, "rlimits");
    for (int i = 0; i < nrl; i++) {
        struct rlimit rl = {(rlim_t)rl_val[i], (rlim_t)rl_val[i]};
        if (setrlimit(rl_res[i], &rl) < 0)
            fail(errno, NULL);
    }
    if (getuid() != p.uid || getgid() != p.gid) {
        snprintf(step, sizeof step, "drop to uid %u", p.uid);
        if (setgroups(0, NULL) < 0 || setresgid(p.gid, p.gid, p.gid) < 0 ||
            setresuid(p.uid, p.uid, p.uid) < 0)
            fail(errno, NULL);
    }

    if (p.has_ll) {
        strcpy(step, "landlock");
        int rs = (int)syscall(LL_CREATE, &p.ll, (size_t)p.ll_size, 0);
        if (rs < 0)
            fail(errno, "landlock_create_ruleset");
        for (int i = 0; i < npaths; i++) {
            int fd = open(ll_paths[i], O_PATH | O_CLOEXEC);
            if (fd < 0) {
                if (errno == ENOENT || errno == ENOTDIR)
                    continue;  /* absent: nothing to grant */
                char what[4300];
                snprintf(what, sizeof what, "cannot open '%s' to grant access to it", ll_paths[i]);
                fail(errno, what);
            }
            struct stat st;
            uint64_t access = ll_access[i];
            if (fstat(fd, &st) < 0)
                fail(errno, ll_paths[i]);
            if (!S_ISDIR(st.st_mode))
                access &= LL_FILE_RIGHTS;
            struct ll_path rule = {access, fd};
            if (syscall(LL_ADD_RULE, rs, LL_RULE_PATH_BENEATH, &rule, 0) < 0)
                fail(errno, "landlock_add_rule");
            close(fd);
        }
        for (int i = 0; i < nports; i++) {
            struct ll_port rule = {LL_CONNECT_TCP, ports[i]};
            if (syscall(LL_ADD_RULE, rs, LL_RULE_NET_PORT, &rule, 0) < 0)
                fail(errno, "landlock_add_rule");
        }
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
            fail(errno, "no_new_privs");
        if (syscall(LL_RESTRICT, rs, 0) < 0)
            fail(errno, "landlock_restrict_self");
        close(rs);
    }
    if (p.seccomp.filter) {
        strcpy(step, "seccomp");
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
            fail(errno, "no_new_privs");
        if (prctl(PR_SET_SECCOMP, 2 /* SECCOMP_MODE_FILTER */, &p.seccomp, 0, 0) < 0)
            fail(errno, "loading the filter failed");
    }

    snprintf(step, sizeof step, "exec %s", p.exe);
    if (bin >= 0)
        fexecve(bin, p.argv, p.envp);
    else
        execve(p.exe, p.argv, p.envp);
    fail(errno, NULL);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "reap") == 0)
        return reaper_main(argc, argv);
    if (argc > 1 && strcmp(argv[1], "park") == 0)
        return park_main(argc, argv);
    /* Nothing but our three fds (and 0-2, replaced later) from whoever started us: an
     * fd that sat at 64 or among the plan's would otherwise outlive every sweep below. */
    close_from(6, ~0U);
    return stage_run(1);
}
