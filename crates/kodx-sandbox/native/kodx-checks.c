/*
 * kodx-net checks: the repository's checks (SPEC §11), attempt after attempt, through one
 * engine exec that kodx starts while it prepares the sandbox, before anything of the
 * repository runs there (the setup script, the first shell). Part of kodx-net.c (one
 * translation unit, no libc: it uses the syscalls and helpers defined there).
 *
 * Its first act is to make itself non-dumpable: from then on no process of the sandbox
 * (none has CAP_SYS_PTRACE) can open its /proc/PID/fd/ entries (stdin and stdout are
 * kodx's channel), its memory or its environment, nor trace it. As nothing of the
 * repository ran before, nothing can have opened them earlier. Then it writes the hello
 * frame and serves batches from stdin, one at a time, until stdin ends (exit 0).
 *
 * A batch, on stdin (integers big-endian):
 *   u32 LENGTH of the rest; u32 WITHIN_MS; u16 COUNT; u16 DIR_LEN; DIR;
 *   COUNT times: u32 TIMEOUT_MS; u32 LEN; COMMAND (LEN bytes, no NUL)
 * Frames, on stdout: u8 TYPE, u8 0, u16 INDEX, u32 LEN, then LEN bytes:
 *   'H' once, first: u32 its pid, u32 the protocol's version (1)
 *   'B' check INDEX began: u32 its pid (its session and process group)
 *   'O' output of check INDEX (1 to 65536 bytes)
 *   'E' check INDEX ended: u8 how, u32 value: 'x' exited (status), 's' killed by a
 *       signal (signal), 't' timed out and killed, 'n' not started (WITHIN_MS had
 *       passed), 'f' could not be started (errno)
 *   'Z' the batch is over (INDEX: COUNT)
 * A check is `bash -c COMMAND` (bash from $PATH) in DIR, stdin /dev/null, stdout and stderr
 * one pipe that only this program reads, in a session and process group of its own, under
 * min(TIMEOUT_MS, what is left of WITHIN_MS). When it ends or times out, its process
 * group is killed, and so is every process it left that escaped the group: this program
 * is a child subreaper, so the orphans of a check come to it (not to the container's
 * init), and it kills its children until none is left. Processes started before the
 * runner (the setup script's services) are not its children and stay. Nothing a check
 * does reaches this program's stdout: its fds
 * are close-on-exec, the check's 0, 1 and 2 are /dev/null and its pipe, and the rest are
 * closed before bash runs. A malformed batch: exit 2.
 */

#if defined(__x86_64__)
#define SYS_rt_sigaction 13
#define SYS_rt_sigprocmask 14
#define SYS_getpid 39
#define SYS_clone 56
#define SYS_wait4 61
#define SYS_kill 62
#define SYS_chdir 80
#define SYS_getppid 110
#define SYS_setsid 112
#define SYS_prctl 157
#define SYS_signalfd4 289
#define SYS_dup3 292
#define SYS_pipe2 293
#elif defined(__aarch64__)
#define SYS_rt_sigaction 134
#define SYS_rt_sigprocmask 135
#define SYS_getpid 172
#define SYS_clone 220
#define SYS_wait4 260
#define SYS_kill 129
#define SYS_chdir 49
#define SYS_getppid 173
#define SYS_setsid 157
#define SYS_prctl 167
#define SYS_signalfd4 74
#define SYS_dup3 24
#define SYS_pipe2 59
#endif
#define SYS_close_range 436

#define PR_SET_PDEATHSIG 1
#define PR_SET_DUMPABLE 4
#define PR_SET_CHILD_SUBREAPER 36
#define SIG_SETMASK_ 2
#define SIGKILL_ 9
#define SIGPIPE_ 13
#define SIGCHLD_ 17
#define WNOHANG_ 1
#define POLLIN_ 1
#define EINTR_ 4
#define EAGAIN_ 11
#define SFD_NONBLOCK_ 04000

/* After a check's end (or its timeout), how long what is left in its pipe is read. */
#define CK_GRACE_MS 2000
#define CK_MAX 64
#define CK_PAYLOAD 65536

struct pollfd_ {
    int fd;
    short events, revents;
};
/* The kernel's struct sigaction (x86_64 and aarch64 alike). */
struct ksigaction_ {
    long handler;
    unsigned long flags;
    long restorer;
    unsigned long mask;
};

static u8 ck_frame[8 + CK_PAYLOAD];
static u8 ck_batch[1 << 18];
static char ck_text[(1 << 18) + CK_MAX + 8];
static char *ck_cmd[CK_MAX];
static long ck_timeout[CK_MAX];
static char *ck_dir;
static u8 ck_dents[8192];
static long ck_self, ck_sfd = -1;
/* The check that runs (its pid, which is its process group), 0 between checks. */
static long ck_running;

static long mono_ms(void) {
    struct timespec_ t = {0, 0};
    sys6(SYS_clock_gettime, 1 /* CLOCK_MONOTONIC */, (long)&t, 0, 0, 0, 0);
    return t.sec * 1000 + t.nsec / 1000000;
}
static void be32(u8 *p, u32 v) {
    p[0] = (u8)(v >> 24), p[1] = (u8)(v >> 16), p[2] = (u8)(v >> 8), p[3] = (u8)v;
}
static u32 get32(const u8 *p) { return (u32)p[0] << 24 | (u32)p[1] << 16 | (u32)p[2] << 8 | p[3]; }
static u32 get16(const u8 *p) { return (u32)p[0] << 8 | p[1]; }
static void ck_sleep_ms(long ms) {
    struct timespec_ t = {ms / 1000, (ms % 1000) * 1000000};
    sys6(SYS_ppoll, 0, 0, (long)&t, 0, 8, 0);
}

/* Writes a frame whose LEN bytes are at ck_frame + 8 already. kodx gone: the check that
 * runs is killed and this program ends. */
static void ck_send(char type, u32 index, u32 len) {
    ck_frame[0] = (u8)type;
    ck_frame[1] = 0;
    ck_frame[2] = (u8)(index >> 8);
    ck_frame[3] = (u8)index;
    be32(ck_frame + 4, len);
    size_t off = 0, n = 8 + (size_t)len;
    while (off < n) {
        long w = sys6(SYS_write, 1, (long)(ck_frame + off), (long)(n - off), 0, 0, 0);
        if (w == -EINTR_) continue;
        if (w <= 0) {
            if (ck_running) sys6(SYS_kill, -ck_running, SIGKILL_, 0, 0, 0, 0);
            sys6(SYS_exit_group, 1, 0, 0, 0, 0, 0);
        }
        off += (size_t)w;
    }
}
static void ck_end(u32 index, char how, u32 value) {
    ck_frame[8] = (u8)how;
    be32(ck_frame + 9, value);
    ck_send('E', index, 5);
}

/* Reaps every child that ended; returns the wait status of `pid` when it was one of them
 * (-1 otherwise). */
static long ck_reap(long pid) {
    long found = -1;
    for (;;) {
        int st = 0;
        long w = sys6(SYS_wait4, -1, (long)&st, WNOHANG_, 0, 0, 0);
        if (w <= 0) return found;
        if (w == pid) found = (long)(u32)st;
    }
}
static void ck_drain_signals(void) {
    u8 info[128 * 4];
    while (sys6(SYS_read, ck_sfd, (long)info, sizeof info, 0, 0, 0) > 0) {
    }
}

/* The parent of process `pid` (digits), from /proc/PID/stat; -1 when it is gone or a
 * zombie (the reaping ends it). */
static long ck_parent(const char *pid) {
    char p[48] = "/proc/";
    int i = 6;
    for (int k = 0; pid[k] && i < 30; k++) p[i++] = pid[k];
    const char *rest = "/stat";
    while (*rest) p[i++] = *rest++;
    p[i] = 0;
    long fd = sys6(SYS_openat, AT_FDCWD, (long)p, O_RDONLY | O_CLOEXEC, 0, 0, 0);
    if (fd < 0) return -1;
    char b[512];
    long n = sys6(SYS_read, fd, (long)b, sizeof b - 1, 0, 0, 0);
    sys6(SYS_close, fd, 0, 0, 0, 0, 0);
    if (n <= 0) return -1;
    /* "PID (COMM) S PPID ...": COMM may hold ')' itself, so the last one ends it. */
    long close = -1;
    for (long k = 0; k < n; k++)
        if (b[k] == ')') close = k;
    if (close < 0 || close + 4 >= n || b[close + 2] == 'Z') return -1;
    long v = 0;
    for (long k = close + 4; k < n && b[k] >= '0' && b[k] <= '9'; k++) v = v * 10 + (b[k] - '0');
    return v;
}

/* Kills every child of this program (a timed-out check's leader, the orphans a check
 * left, which came to it as their subreaper) and reaps them, round after round as their
 * own children come to it, until none is left or 5 s passed. */
static void ck_kill_children(void) {
    long end = mono_ms() + 5000;
    while (mono_ms() < end) {
        int found = 0;
        long d = sys6(SYS_openat, AT_FDCWD, (long)"/proc", O_RDONLY | O_DIRECTORY | O_CLOEXEC, 0, 0, 0);
        if (d < 0) return;
        for (;;) {
            long n = sys6(SYS_getdents64, d, (long)ck_dents, sizeof ck_dents, 0, 0, 0);
            if (n <= 0) break;
            for (long off = 0; off < n;) {
                u16 reclen = *(u16 *)(ck_dents + off + 16);
                const char *name = (const char *)ck_dents + off + 19;
                off += reclen;
                long pid = 0;
                int digits = 0;
                while (name[digits] >= '0' && name[digits] <= '9' && digits < 10)
                    pid = pid * 10 + (name[digits++] - '0');
                if (!digits || name[digits] || pid == ck_self) continue;
                if (ck_parent(name) != ck_self) continue;
                sys6(SYS_kill, pid, SIGKILL_, 0, 0, 0, 0);
                sys6(SYS_kill, -pid, SIGKILL_, 0, 0, 0, 0);
                found = 1;
            }
        }
        sys6(SYS_close, d, 0, 0, 0, 0, 0);
        ck_reap(0);
        if (!found) return;
        ck_sleep_ms(2);
    }
}

static const char *ck_path(char **envp) {
    for (; *envp; envp++) {
        const char *e = *envp;
        if (e[0] == 'P' && e[1] == 'A' && e[2] == 'T' && e[3] == 'H' && e[4] == '=') return e + 5;
    }
    return "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
}
static void ck_say(const char *a, const char *b) {
    sys6(SYS_write, 2, (long)a, (long)slen(a), 0, 0, 0);
    sys6(SYS_write, 2, (long)b, (long)slen(b), 0, 0, 0);
    sys6(SYS_write, 2, (long)"\n", 1, 0, 0, 0);
}

/* In the forked child: becomes the check (`bash -c cmd` with the pipe `wfd` as its output). */
static void ck_child(const char *cmd, long wfd, char **envp) {
    sys6(SYS_setsid, 0, 0, 0, 0, 0, 0);
    /* Ends with this program (killed by a check, or kodx gone). */
    sys6(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL_, 0, 0, 0, 0);
    if (sys6(SYS_getppid, 0, 0, 0, 0, 0, 0) != ck_self) sys6(SYS_exit_group, 127, 0, 0, 0, 0, 0);
    unsigned long none = 0;
    sys6(SYS_rt_sigprocmask, SIG_SETMASK_, (long)&none, 0, 8, 0, 0);
    struct ksigaction_ dfl = {0 /* SIG_DFL */, 0, 0, 0};
    sys6(SYS_rt_sigaction, SIGPIPE_, (long)&dfl, 0, 8, 0, 0);
    long nul = sys6(SYS_openat, AT_FDCWD, (long)"/dev/null", O_RDONLY, 0, 0, 0);
    if (nul >= 0)
        sys6(SYS_dup3, nul, 0, 0, 0, 0, 0);
    else
        sys6(SYS_close, 0, 0, 0, 0, 0, 0);
    sys6(SYS_dup3, wfd, 1, 0, 0, 0, 0);
    sys6(SYS_dup3, wfd, 2, 0, 0, 0, 0);
    if (sys6(SYS_close_range, 3, ~0u, 0, 0, 0, 0) < 0)
        for (long fd = 3; fd < 4096; fd++) sys6(SYS_close, fd, 0, 0, 0, 0, 0);
    long r = sys6(SYS_chdir, (long)ck_dir, 0, 0, 0, 0, 0);
    if (r < 0) {
        ck_say("kodx: cannot enter the directory ", ck_dir);
        sys6(SYS_exit_group, 127, 0, 0, 0, 0, 0);
    }
    char *argv[] = {"bash", "-c", (char *)cmd, 0};
    static char exe[4200];
    const char *p = ck_path(envp);
    for (;;) {
        const char *e = p;
        while (*e && *e != ':') e++;
        size_t n = (size_t)(e - p);
        if (n < 4096) {
            memcpy(exe, p, n);
            memcpy(exe + n, n ? "/bash" : "bash", n ? 6 : 5);
            sys6(SYS_execve, (long)exe, (long)argv, (long)envp, 0, 0, 0);
        }
        if (!*e) break;
        p = e + 1;
    }
    ck_say("kodx: bash: not found in PATH", "");
    sys6(SYS_exit_group, 127, 0, 0, 0, 0, 0);
}

/* Runs check `i` until `deadline` (monotonic ms), its frames on stdout. */
static void ck_run(u32 i, const char *cmd, long deadline, char **envp) {
    int p[2];
    long r = sys6(SYS_pipe2, (long)p, O_CLOEXEC, 0, 0, 0, 0);
    if (r < 0) {
        ck_end(i, 'f', (u32)-r);
        return;
    }
    long pid = sys6(SYS_clone, SIGCHLD_, 0, 0, 0, 0, 0);
    if (pid < 0) {
        sys6(SYS_close, p[0], 0, 0, 0, 0, 0);
        sys6(SYS_close, p[1], 0, 0, 0, 0, 0);
        ck_end(i, 'f', (u32)-pid);
        return;
    }
    if (pid == 0) ck_child(cmd, p[1], envp);
    sys6(SYS_close, p[1], 0, 0, 0, 0, 0);
    ck_running = pid;
    be32(ck_frame + 8, (u32)pid);
    ck_send('B', i, 4);
    int open = 1, exited = 0, timed_out = 0;
    long status = 0, until = deadline;
    for (;;) {
        long st = ck_reap(pid);
        if (st >= 0 && !exited) {
            exited = 1, status = st;
            /* What it left goes with it: in its group, or escaped from it (orphans come to
             * this program). Nothing of it may touch the next check, or hold its pipe. */
            sys6(SYS_kill, -pid, SIGKILL_, 0, 0, 0, 0);
            ck_kill_children();
            until = mono_ms() + CK_GRACE_MS;
        }
        if (exited && !open) break;
        long now = mono_ms();
        if (now >= until) {
            timed_out = !exited;
            break;
        }
        struct pollfd_ fds[2] = {{open ? p[0] : -1, POLLIN_, 0}, {(int)ck_sfd, POLLIN_, 0}};
        struct timespec_ ts = {(until - now) / 1000, ((until - now) % 1000) * 1000000};
        sys6(SYS_ppoll, (long)fds, 2, (long)&ts, 0, 8, 0);
        if (open && fds[0].revents) {
            long k = sys6(SYS_read, p[0], (long)(ck_frame + 8), CK_PAYLOAD, 0, 0, 0);
            if (k > 0)
                ck_send('O', i, (u32)k);
            else if (k != -EINTR_ && k != -EAGAIN_)
                open = 0;
        }
        if (fds[1].revents) ck_drain_signals();
    }
    if (timed_out) {
        sys6(SYS_kill, -pid, SIGKILL_, 0, 0, 0, 0);
        ck_kill_children();
        /* What it wrote before it was killed. */
        long end = mono_ms() + CK_GRACE_MS;
        while (open && mono_ms() < end) {
            struct pollfd_ fd = {p[0], POLLIN_, 0};
            struct timespec_ ts = {0, 50 * 1000000};
            if (sys6(SYS_ppoll, (long)&fd, 1, (long)&ts, 0, 8, 0) <= 0) continue;
            long k = sys6(SYS_read, p[0], (long)(ck_frame + 8), CK_PAYLOAD, 0, 0, 0);
            if (k > 0)
                ck_send('O', i, (u32)k);
            else if (k != -EINTR_ && k != -EAGAIN_)
                open = 0;
        }
    }
    sys6(SYS_close, p[0], 0, 0, 0, 0, 0);
    ck_running = 0;
    if (timed_out)
        ck_end(i, 't', 0);
    else if ((status & 0x7f) == 0)
        ck_end(i, 'x', (u32)(status >> 8) & 0xff);
    else
        ck_end(i, 's', (u32)status & 0x7f);
}

/* Reads exactly `n` bytes of stdin; 0 at its end. */
static int ck_read(u8 *p, size_t n) {
    while (n) {
        long r = sys6(SYS_read, 0, (long)p, (long)n, 0, 0, 0);
        if (r == -EINTR_) continue;
        if (r <= 0) return 0;
        p += r, n -= (size_t)r;
    }
    return 1;
}

/* Waits for the next batch (reaping what ends meanwhile) and parses it; its COUNT, or -1
 * at the end of stdin. */
static long ck_next_batch(long *within) {
    for (;;) {
        struct pollfd_ fds[2] = {{0, POLLIN_, 0}, {(int)ck_sfd, POLLIN_, 0}};
        sys6(SYS_ppoll, (long)fds, 2, 0, 0, 8, 0);
        if (fds[1].revents) ck_drain_signals(), ck_reap(0);
        if (fds[0].revents) break;
    }
    u8 head[4];
    if (!ck_read(head, 4)) return -1;
    u32 len = get32(head);
    if (len < 8 || len > sizeof ck_batch) die("checks: a batch of a bad length", 0, 2);
    if (!ck_read(ck_batch, len)) die("checks: the batch was cut short", 0, 2);
    *within = get32(ck_batch);
    u32 count = get16(ck_batch + 4), dlen = get16(ck_batch + 6), at = 8;
    if (count > CK_MAX || dlen == 0 || dlen > 4096 || at + dlen > len) die("checks: a bad batch", 0, 2);
    size_t t = 0;
    ck_dir = ck_text;
    memcpy(ck_text, ck_batch + at, dlen);
    ck_text[dlen] = 0, t = dlen + 1, at += dlen;
    for (u32 k = 0; k < count; k++) {
        if (at + 8 > len) die("checks: a bad batch", 0, 2);
        ck_timeout[k] = get32(ck_batch + at);
        u32 n = get32(ck_batch + at + 4);
        at += 8;
        if (n == 0 || n > len - at) die("checks: a bad batch", 0, 2);
        for (u32 c = 0; c < n; c++)
            if (!ck_batch[at + c]) die("checks: a NUL in a command", 0, 2);
        ck_cmd[k] = ck_text + t;
        memcpy(ck_text + t, ck_batch + at, n);
        ck_text[t + n] = 0, t += n + 1, at += n;
    }
    if (at != len) die("checks: a bad batch", 0, 2);
    return count;
}

static void checks(char **envp) {
    if (sys6(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0, 0) < 0) die("checks: becoming non-dumpable", 0, 1);
    if (sys6(SYS_prctl, PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0, 0) < 0) die("checks: becoming a subreaper", 0, 1);
    /* 0, 1 and 2 open, so that no pipe of a check is one of them. */
    for (;;) {
        long fd = sys6(SYS_openat, AT_FDCWD, (long)"/dev/null", O_RDWR, 0, 0, 0);
        if (fd < 0) break;
        if (fd > 2) {
            sys6(SYS_close, fd, 0, 0, 0, 0, 0);
            break;
        }
    }
    /* kodx gone: a write fails (EPIPE) and ck_send ends the check that runs first. */
    struct ksigaction_ ign = {1 /* SIG_IGN */, 0, 0, 0};
    sys6(SYS_rt_sigaction, SIGPIPE_, (long)&ign, 0, 8, 0, 0);
    unsigned long chld = 1ul << (SIGCHLD_ - 1);
    sys6(SYS_rt_sigprocmask, SIG_SETMASK_, (long)&chld, 0, 8, 0, 0);
    ck_sfd = sys6(SYS_signalfd4, -1, (long)&chld, 8, O_CLOEXEC | SFD_NONBLOCK_, 0, 0);
    if (ck_sfd < 0) die("checks: signalfd", ck_sfd, 1);
    ck_self = sys6(SYS_getpid, 0, 0, 0, 0, 0, 0);
    be32(ck_frame + 8, (u32)ck_self);
    be32(ck_frame + 12, 1);
    ck_send('H', 0, 8);
    for (;;) {
        long within = 0;
        long count = ck_next_batch(&within);
        if (count < 0) sys6(SYS_exit_group, 0, 0, 0, 0, 0, 0);
        long end = mono_ms() + within;
        for (long k = 0; k < count; k++) {
            long now = mono_ms();
            if (now >= end) {
                ck_end((u32)k, 'n', 0);
                continue;
            }
            long deadline = now + ck_timeout[k];
            ck_run((u32)k, ck_cmd[k], deadline < end ? deadline : end, envp);
        }
        ck_send('Z', (u32)count, 0);
    }
}
