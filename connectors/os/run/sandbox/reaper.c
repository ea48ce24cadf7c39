/* The init of a parked sandbox once it is set up: pid 1 of the action's namespace.
 *
 * park.c's init calls reap_target() once its target is forked; a parked init of the
 * Python park (pool.py, where park.c could not start one) execs this program as
 * "reap <target pid>" (`sensorium-exec-stage reap N`). Either way, from here to the
 * action's end pid 1 is a few kilobytes of C instead of a forked interpreter, and its
 * exit (which the connector waits for: the init's pidfd turns readable only once its
 * namespace is gone) tears down no Python heap.
 *
 * It does exactly what stage.supervise did for a parked init, with its lines:
 * err_fd (fd 3 as `reap`): the target's error pipe (EOF when the action's exec
 *       succeeded);
 * ctl_fd (fd 4 as `reap`): a SOCK_SEQPACKET from the zygote; one message "report"
 *       with the report pipe's fd; anything else, or EOF, means the sandbox was
 *       discarded.
 * Report lines: "staged", then "error <why>" or "started", then "usage ..." and
 * "exit <wait status>" (accounting.py's format). SIGTERM goes to every other process
 * of the namespace. It exits when its target does; the namespace goes with it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_FAILURE 65536

/* The stage's "could not start" text (its lines are a few KiB at most), and one
 * report line; static, so no allocation can fail on the way to saying either. */
static char failure[MAX_FAILURE];
static char line[MAX_FAILURE + 16];

static void report(int fd, const char *text, size_t len) {
    /* One line: a newline inside becomes a space, as stage._report does. */
    if (len > sizeof line - 1)
        len = sizeof line - 1;
    for (size_t i = 0; i < len; i++)
        line[i] = text[i] == '\n' ? ' ' : text[i];
    line[len] = '\n';
    if (write(fd, line, len + 1)) {}
}

static void say(int fd, const char *text) { report(fd, text, strlen(text)); }

/* (rchar, wchar, bytes this read returned) of /proc/self/io; 0 when unreadable. */
static int io_of_self(long long *rchar, long long *wchar, long long *cost) {
    char buf[1024];
    int fd = open("/proc/self/io", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n, total = 0;
    while (total < (ssize_t)sizeof buf - 1 &&
           (n = read(fd, buf + total, sizeof buf - 1 - (size_t)total)) > 0)
        total += n;
    close(fd);
    buf[total] = 0;
    char *r = strstr(buf, "rchar:"), *w = strstr(buf, "wchar:");
    if (!r || !w)
        return 0;
    *rchar = strtoll(r + 6, NULL, 10);
    *wchar = strtoll(w + 6, NULL, 10);
    *cost = total;
    return 1;
}

static void on_term(int sig) {
    (void)sig;
    kill(-1, SIGTERM);  /* pid 1: every other process of the namespace, nothing else */
}

static void ms(char *out, size_t size, struct timeval tv) {
    long long usec = (long long)tv.tv_sec * 1000000 + tv.tv_usec;
    snprintf(out, size, "%lld.%03lld", usec / 1000, usec % 1000);
}

/* SIGTERM from outside goes to every other process of the namespace. */
void reaper_arm(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_term;
    sa.sa_flags = SA_RESTART;  /* a forwarded SIGTERM must not cut a report line short */
    sigaction(SIGTERM, &sa, NULL);
}

int reap_target(pid_t target, int err_fd, int ctl_fd);

int reaper_main(int argc, char **argv) {
    reaper_arm();
    if (argc != 3)
        _exit(1);
    pid_t target = (pid_t)strtol(argv[2], NULL, 10);
    if (syscall(SYS_close_range, 5U, ~0U, 0) != 0)
        for (int fd = 5; fd < 65536; fd++)
            close(fd);
    return reap_target(target, 3, 4);
}

/* Waits on ``ctl_fd`` for the directive's report pipe, then supervises ``target``
 * (whose error pipe is ``err_fd``) to its end. Never returns. */
int reap_target(pid_t target, int err_fd, int ctl_fd) {
    /* The directive's report pipe, or nothing: discarded, or the zygote is gone. */
    char msg[16];
    union {
        char buf[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } cbuf;
    struct iovec iov = {msg, sizeof msg};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf.buf,
                        .msg_controllen = sizeof cbuf.buf};
    ssize_t got;
    do
        got = recvmsg(ctl_fd, &mh, MSG_CMSG_CLOEXEC);
    while (got < 0 && errno == EINTR);
    int fds[4], nfds = 0;
    for (struct cmsghdr *c = got > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        int n = (int)((c->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        for (int i = 0; i < n && nfds < 4; i++)
            memcpy(&fds[nfds++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    if (got != 6 || memcmp(msg, "report", 6) != 0 || nfds != 1)
        _exit(0);  /* the target goes with us */
    close(ctl_fd);
    int out = fds[0];

    /* EOF at the action's exec; the stage's line when it could not. */
    memcpy(failure, "error ", 6);
    size_t flen = 6;
    ssize_t n;
    while (flen < MAX_FAILURE &&
           ((n = read(err_fd, failure + flen, MAX_FAILURE - flen)) > 0 || (n < 0 && errno == EINTR)))
        if (n > 0)
            flen += (size_t)n;
    close(err_fd);
    say(out, "staged");
    if (flen > 6) {
        report(out, failure, flen);
        _exit(1);
    }
    say(out, "started");

    long long r0 = 0, w0 = 0, cost = 0;
    int io = io_of_self(&r0, &w0, &cost);
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, 0);
        if (pid < 0) {
            if (errno == EINTR)
                continue;
            _exit(0);  /* no child left */
        }
        if (pid != target)
            continue;
        /* Before the exit line: the connector reads both once the report closes. */
        struct rusage ru;
        getrusage(RUSAGE_CHILDREN, &ru);
        long long r1, w1, c1;
        char user[32], sys[32], peak[32] = "-", rd[32] = "-", wr[32] = "-", text[256];
        ms(user, sizeof user, ru.ru_utime);
        ms(sys, sizeof sys, ru.ru_stime);
        if (ru.ru_maxrss > 0)
            snprintf(peak, sizeof peak, "%lld", (long long)ru.ru_maxrss * 1024);
        if (io && io_of_self(&r1, &w1, &c1)) {
            long long read_bytes = r1 - r0 - cost;
            snprintf(rd, sizeof rd, "%lld", read_bytes > 0 ? read_bytes : 0);
            snprintf(wr, sizeof wr, "%lld", w1 - w0);
        }
        snprintf(text, sizeof text,
                 "usage source=rusage cpu_user_ms=%s cpu_system_ms=%s peak_memory_bytes=%s "
                 "io_read_bytes=%s io_write_bytes=%s",
                 user, sys, peak, rd, wr);
        say(out, text);
        snprintf(text, sizeof text, "exit %d", status);
        say(out, text);
        _exit(0);  /* leaving takes every other process of the namespace with us */
    }
}
