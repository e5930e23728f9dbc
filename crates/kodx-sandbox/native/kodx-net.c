/*
 * kodx-net: the tiny helper kodx ships as its own image (`kodx-helper:<hash>`, this program
 * alone) and mounts read-only into each sandbox: the process that keeps a sandbox alive,
 * its shells started ahead and its snapshot; and, in the engine's fencer (a container of
 * that image), what plugs and fences a sandbox's network (src/net/). Static, no
 * libc: build.rs compiles it with `-nostdlib -static` for Linux x86_64 or aarch64, and kodx
 * embeds the binary, so no image needs `ip` or anything else.
 *
 *   kodx-net hold
 *       Waits for a signal, forever: a sandbox's main process under the engine's init, so
 *       that nothing of the image runs in the container before it is fenced.
 *   kodx-net hold-idle SECS
 *       The fencer's main process: as `hold`, but exits once `fence` has not run for SECS
 *       seconds (the engine then removes the fencer, made with auto-remove).
 *   kodx-net fence PID SPEC...
 *       Run in the fencer (host PID namespace, CAP_SYS_ADMIN and CAP_NET_ADMIN): enters the
 *       network namespace of process PID (a sandbox's init), then does what `routes` does.
 *   kodx-net plug PID BRIDGE NET/PREFIX GATEWAY FIRST COUNT DNS SPEC...
 *       As `fence`, for a sandbox made without a network: first gives it `eth0`, a veth
 *       whose other end (`kx<address in hex>`) is an isolated port of BRIDGE on the host
 *       (no frame passes between two sandboxes), with an address of NET whose index in
 *       the subnet is in FIRST..FIRST+COUNT-1 (the first free one from PID mod COUNT on)
 *       and a default route via GATEWAY; writes the host's nftables filter for BRIDGE and
 *       the sandbox's own output filter (broadcast, multicast, IPv6, the subnet unless an
 *       `a` SPEC allows it: see `host_filter`, `sandbox_filter`); then adds the routes,
 *       and an unreachable /32 for each of the engine host's addresses (read in the host's
 *       namespace now) that no `a<addr>/<prefix>` SPEC (an allowed range, not a route)
 *       covers, and the subnet's two halves (its other sandboxes); then keeps in the
 *       sandbox's /etc/resolv.conf (opened through /proc/PID/root, resolved inside it)
 *       only the resolvers it can reach, or DNS (comma-separated hex addresses, `-` for
 *       none) when none is left. Needs CAP_NET_ADMIN, CAP_SYS_ADMIN and CAP_SYS_PTRACE.
 *   kodx-net unplug PID
 *       Removes the sandbox's `eth0` (and so its host end): the network cut. Prints the
 *       addresses left.
 *   kodx-net narrow PID|- GATEWAY PORT ROUTE...
 *       Leaves the sandbox (PID's network namespace; `-`: this one) only GATEWAY's TCP
 *       PORT (kodx's egress proxy) and loopback, and removes the ROUTEs: see `narrow`.
 *       Prints the addresses left.
 *   kodx-net probe ADDR PORT
 *       Asks the HTTP proxy at ADDR:PORT for a name nobody allows and prints the first line
 *       of its answer (`kodx doctor`'s check that a narrowed sandbox reaches the proxy).
 *   kodx-net addrs
 *       Prints every interface address of the current network namespace, one a line:
 *       `4 <8 hex digits>` or `6 <32 hex digits>` (network byte order).
 *   kodx-net gate
 *       A shell started ahead: waits, its terminal's echo off, for one line on stdin (at
 *       most 4095 bytes), then turns the echo back on and runs `/bin/sh -c LINE` in its
 *       place. kodx starts a shell's engine exec this way while the sandbox is still being
 *       fenced and filled (or before the model asks for one), and types the line when the
 *       shell may run: nothing of the image runs before that.
 *   kodx-net checks
 *       The repository's checks, batch after batch from stdin, each check's output and
 *       end as frames on stdout that nothing in the sandbox can write or read (it is
 *       non-dumpable): see kodx-checks.c.
 *   kodx-net snapshot MARKER ROOT
 *       Writes ROOT (a directory) to stdout as a tar, its entries named as the engine's
 *       own archive of ROOT names them (ROOT's last component first), for kodx's change
 *       set. ROOT/.git is left out, and a directory's `.gitignore` comes before its other
 *       entries. A regular file whose inode last changed (ctime) before MARKER's did
 *       (MARKER is written by the same upload, right after the checkout), under
 *       directories none of which changed either (ROOT itself aside), goes as a header
 *       alone, of type 'U' and size 0: "as copied in". Hard links go as copies, sockets not
 *       at all.
 *       Exit 0 only when the whole tree was written.
 *   kodx-net snapshot-on-line MARKER ROOT
 *       As `snapshot`, once a line has come on stdin: kodx starts it ahead of the run's end,
 *       so the engine's exec is off the path (end of input first: exit 3, nothing written).
 *   kodx-net routes SPEC...
 *       Adds IPv4 routes to the main table, then prints the addresses as `addrs` does.
 *       SPEC is `u<addr>/<prefix>` (an unreachable route: a connect fails at once with
 *       EHOSTUNREACH) or `g<addr>/<prefix>/<gateway>` (an ordinary route via the gateway);
 *       `n<net>/<prefix>` (the sandbox's subnet) writes the sandbox's output filter, with
 *       the `a<addr>/<prefix>` SPECs as what it allows; addresses in 8 hex digits.
 *
 * Exit 0 on success; on failure one line on stderr naming the step and the errno, exit 1
 * (2: bad arguments).
 */

typedef unsigned long size_t;
typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

#if defined(__x86_64__)
#define SYS_write 1
#define SYS_socket 41
#define SYS_sendto 44
#define SYS_recvfrom 45
#define SYS_exit_group 231
#define SYS_ppoll 271
#define SYS_openat 257
#define SYS_close 3
#define SYS_setns 308
#define SYS_newfstatat 262
#define SYS_clock_gettime 228
#define SYS_read 0
#define SYS_ioctl 16
#define SYS_execve 59
#define SYS_getdents64 217
#define SYS_readlinkat 267
#define SYS_connect 42
#define SYS_setsockopt 54
#define SYS_lseek 8
#define SYS_ftruncate 77
#define O_DIRECTORY 0200000
#define O_NOFOLLOW 0400000
#define ST_MODE_AT 24
__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "  xor %rbp, %rbp\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call cmain\n"
        "  hlt\n");
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "a"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
#elif defined(__aarch64__)
#define SYS_write 64
#define SYS_socket 198
#define SYS_sendto 206
#define SYS_recvfrom 207
#define SYS_exit_group 94
#define SYS_ppoll 73
#define SYS_openat 56
#define SYS_close 57
#define SYS_setns 268
#define SYS_newfstatat 79
#define SYS_clock_gettime 113
#define SYS_read 63
#define SYS_ioctl 29
#define SYS_execve 221
#define SYS_getdents64 61
#define SYS_readlinkat 78
#define SYS_connect 203
#define SYS_setsockopt 208
#define SYS_lseek 62
#define SYS_ftruncate 46
#define O_DIRECTORY 040000
#define O_NOFOLLOW 0100000
#define ST_MODE_AT 16
__asm__(".text\n"
        ".global _start\n"
        "_start:\n"
        "  mov x29, #0\n"
        "  mov x30, #0\n"
        "  mov x0, sp\n"
        "  bl cmain\n"
        "  brk #0\n");
static long sys6(long n, long a, long b, long c, long d, long e, long f) {
    register long x8 __asm__("x8") = n;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc 0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory");
    return x0;
}
#else
#error "kodx-net supports Linux x86_64 and aarch64"
#endif

/* The compiler may emit calls to these for struct copies and zeroing. */
void *memset(void *d, int c, size_t n) {
    u8 *p = d;
    while (n--) *p++ = (u8)c;
    return d;
}
void *memcpy(void *d, const void *s, size_t n) {
    u8 *p = d;
    const u8 *q = s;
    while (n--) *p++ = *q++;
    return d;
}

static int memcmp_(const void *a, const void *b, size_t n) {
    const u8 *x = a, *y = b;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    return 0;
}
static size_t slen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}


#define AF_INET 2
#define AF_INET6 10
#define AF_NETLINK 16
#define SOCK_RAW 3
#define SOCK_CLOEXEC 02000000
#define NETLINK_ROUTE 0

#define NLMSG_ERROR 2
#define NLMSG_DONE 3
#define NLM_F_REQUEST 0x1
#define NLM_F_ACK 0x4
#define NLM_F_EXCL 0x200
#define NLM_F_CREATE 0x400
#define NLM_F_DUMP 0x300
#define RTM_NEWADDR 20
#define RTM_GETADDR 22
#define RTM_NEWROUTE 24
#define RTM_DELROUTE 25
#define RT_TABLE_MAIN 254
#define RTPROT_STATIC 4
#define RT_SCOPE_UNIVERSE 0
#define RTN_UNICAST 1
#define RTN_UNREACHABLE 7
#define RTA_DST 1
#define RTA_GATEWAY 5
#define RTA_OIF 4
#define RT_SCOPE_LINK 253
#define NLM_F_REPLACE 0x100
#define IFA_ADDRESS 1
#define IFA_LOCAL 2
#define IFA_BROADCAST 4

struct nlmsghdr {
    u32 len;
    u16 type;
    u16 flags;
    u32 seq;
    u32 pid;
};
struct rtmsg {
    u8 family, dst_len, src_len, tos, table, protocol, scope, type;
    u32 flags;
};
struct ifaddrmsg {
    u8 family, prefixlen, flags, scope;
    u32 index;
};
struct rtattr {
    u16 len;
    u16 type;
};
struct sockaddr_nl {
    u16 family;
    u16 pad;
    u32 pid;
    u32 groups;
};

#define ALIGN4(n) (((n) + 3u) & ~3u)

static u8 rbuf[65536];
static char out[8192];
static size_t outlen;
static u32 seq;

static void flush(int fd) {
    size_t off = 0;
    while (off < outlen) {
        long n = sys6(SYS_write, fd, (long)(out + off), (long)(outlen - off), 0, 0, 0);
        if (n <= 0) break;
        off += (size_t)n;
    }
    outlen = 0;
}
static void put(const char *s) {
    while (*s) {
        if (outlen == sizeof out) flush(1);
        out[outlen++] = *s++;
    }
}
static void put_dec(long v) {
    char b[24];
    int i = 23;
    int neg = v < 0;
    b[i] = 0;
    if (neg) v = -v;
    do {
        b[--i] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    if (neg) b[--i] = '-';
    put(b + i);
}
static void put_hex(const u8 *p, int n) {
    static const char d[] = "0123456789abcdef";
    char b[3];
    b[2] = 0;
    for (int i = 0; i < n; i++) {
        b[0] = d[p[i] >> 4];
        b[1] = d[p[i] & 15];
        put(b);
    }
}
static void die(const char *what, long err, int code) {
    flush(1);
    put("kodx-net: ");
    put(what);
    if (err) {
        put(": errno ");
        put_dec(-err);
    }
    put("\n");
    flush(2);
    sys6(SYS_exit_group, code, 0, 0, 0, 0, 0);
    for (;;) {
    }
}

static long parse_dec(const char *s) {
    long v = 0;
    int n = 0;
    while (*s >= '0' && *s <= '9' && n < 9) v = v * 10 + (*s++ - '0'), n++;
    if (!n || *s) die("bad number", 0, 2);
    return v;
}

static int nl_open(void) {
    long fd = sys6(SYS_socket, AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE, 0, 0, 0);
    if (fd < 0) die("opening a netlink socket", fd, 1);
    return (int)fd;
}
static void nl_send(int fd, void *msg, u32 len) {
    struct sockaddr_nl to;
    memset(&to, 0, sizeof to);
    to.family = AF_NETLINK;
    long n = sys6(SYS_sendto, fd, (long)msg, len, 0, (long)&to, sizeof to);
    if (n < 0) die("sending to netlink", n, 1);
}
static long nl_recv(int fd) {
    long n = sys6(SYS_recvfrom, fd, (long)rbuf, sizeof rbuf, 0, 0, 0);
    if (n < 0) die("reading from netlink", n, 1);
    return n;
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}
/* 8 hex digits into 4 bytes; returns the rest of the string or 0. */
static const char *parse_addr(const char *s, u8 a[4]) {
    for (int i = 0; i < 4; i++) {
        int h = hexval(s[2 * i]), l = h < 0 ? -1 : hexval(s[2 * i + 1]);
        if (h < 0 || l < 0) return 0;
        a[i] = (u8)(h * 16 + l);
    }
    return s + 8;
}

/* Adds (or with `del`, removes) the route `spec`; returns the kernel's answer (0 or a
 * negative errno). A removal matches any protocol: the engine's routes are not kodx's. */
static int route_op(int fd, const char *spec, int del) {
    struct {
        struct nlmsghdr h;
        struct rtmsg r;
        struct rtattr dst_a;
        u8 dst[4];
        struct rtattr gw_a;
        u8 gw[4];
    } m;
    memset(&m, 0, sizeof m);
    char kind = spec[0];
    const char *p = parse_addr(spec + 1, m.dst);
    if (!p || *p != '/' || (kind != 'u' && kind != 'g')) die("bad route spec", 0, 2);
    p++;
    int prefix = 0, digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 3) {
        prefix = prefix * 10 + (*p++ - '0');
        digits++;
    }
    if (!digits || prefix > 32) die("bad route prefix", 0, 2);
    u32 len = sizeof m.h + sizeof m.r + sizeof m.dst_a + sizeof m.dst;
    m.r.family = AF_INET;
    m.r.dst_len = (u8)prefix;
    m.r.table = RT_TABLE_MAIN;
    m.r.protocol = del ? 0 : RTPROT_STATIC;
    m.r.scope = RT_SCOPE_UNIVERSE;
    m.dst_a.len = sizeof m.dst_a + sizeof m.dst;
    m.dst_a.type = RTA_DST;
    if (kind == 'u') {
        if (*p) die("bad route spec", 0, 2);
        m.r.type = RTN_UNREACHABLE;
    } else {
        if (*p != '/' || !(p = parse_addr(p + 1, m.gw)) || *p) die("bad route gateway", 0, 2);
        m.r.type = RTN_UNICAST;
        m.gw_a.len = sizeof m.gw_a + sizeof m.gw;
        m.gw_a.type = RTA_GATEWAY;
        len += sizeof m.gw_a + sizeof m.gw;
    }
    m.h.len = len;
    m.h.type = del ? RTM_DELROUTE : RTM_NEWROUTE;
    m.h.flags = NLM_F_REQUEST | NLM_F_ACK | (del ? 0 : NLM_F_CREATE | NLM_F_EXCL);
    m.h.seq = ++seq;
    nl_send(fd, &m, len);
    long n = nl_recv(fd);
    struct nlmsghdr *h = (struct nlmsghdr *)rbuf;
    if (n < (long)(sizeof *h + sizeof(int)) || h->type != NLMSG_ERROR) die("no answer to a route", 0, 1);
    return *(int *)(rbuf + sizeof *h);
}

static int route(int fd, const char *spec) { return route_op(fd, spec, 0); }

static void add_route(int fd, const char *spec) {
    int err = route(fd, spec);
    if (err) {
        flush(1);
        put("kodx-net: adding the route ");
        put(spec);
        put(" failed: errno ");
        put_dec(-err);
        put("\n");
        flush(2);
        sys6(SYS_exit_group, 1, 0, 0, 0, 0, 0);
    }
}

/* The engine host's IPv4 addresses, when `plug` read them (in the host's namespace). */
static u32 host_v4[4096];
static int host_v4_n;
static int collect_v4;
/* The sandbox's subnet, as `plug` read it. */
static u32 plug_net, plug_mask;

static void dump_addrs(int fd) {
    struct {
        struct nlmsghdr h;
        struct ifaddrmsg a;
    } m;
    memset(&m, 0, sizeof m);
    m.h.len = sizeof m;
    m.h.type = RTM_GETADDR;
    m.h.flags = NLM_F_REQUEST | NLM_F_DUMP;
    m.h.seq = ++seq;
    nl_send(fd, &m, sizeof m);
    for (;;) {
        long n = nl_recv(fd);
        long off = 0;
        while (off + (long)sizeof(struct nlmsghdr) <= n) {
            struct nlmsghdr *h = (struct nlmsghdr *)(rbuf + off);
            if (h->len < sizeof *h || off + (long)h->len > n) die("a short netlink message", 0, 1);
            if (h->type == NLMSG_DONE) return;
            if (h->type == NLMSG_ERROR) {
                int err = *(int *)(rbuf + off + sizeof *h);
                die("listing addresses", err ? err : -5, 1);
            }
            if (h->type == RTM_NEWADDR && h->len >= sizeof *h + sizeof(struct ifaddrmsg)) {
                struct ifaddrmsg *ifa = (struct ifaddrmsg *)(rbuf + off + sizeof *h);
                int want = ifa->family == AF_INET ? 4 : ifa->family == AF_INET6 ? 16 : 0;
                u32 a = sizeof *h + sizeof *ifa;
                while (want && a + sizeof(struct rtattr) <= h->len) {
                    struct rtattr *ra = (struct rtattr *)(rbuf + off + a);
                    if (ra->len < sizeof *ra || a + ra->len > h->len) break;
                    int t = ra->type;
                    if (collect_v4 && want == 4 && t == IFA_LOCAL && ra->len == sizeof *ra + 4) {
                        const u8 *v = (const u8 *)ra + sizeof *ra;
                        if (host_v4_n < 4096)
                            host_v4[host_v4_n++] = (u32)v[0] << 24 | (u32)v[1] << 16 | (u32)v[2] << 8 | v[3];
                    } else if (!collect_v4 && (t == IFA_ADDRESS || t == IFA_LOCAL || t == IFA_BROADCAST) &&
                        ra->len == sizeof *ra + (u32)want) {
                        put(want == 4 ? "4 " : "6 ");
                        put_hex((u8 *)ra + sizeof *ra, want);
                        put("\n");
                    }
                    a += ALIGN4(ra->len);
                }
            }
            off += ALIGN4(h->len);
        }
    }
}

#define AT_FDCWD (-100)
#define O_RDONLY 0
#define O_WRONLY 1
#define O_CREAT 0100
#define O_TRUNC 01000
#define O_CLOEXEC 02000000
#define CLONE_NEWNET 0x40000000
/* When the fencer was last used: this file's modification time. */
#define USED_FILE "/.kodx-used"

struct timespec_ {
    long sec, nsec;
};

static long now_secs(void) {
    struct timespec_ t = {0, 0};
    sys6(SYS_clock_gettime, 0 /* CLOCK_REALTIME */, (long)&t, 0, 0, 0, 0);
    return t.sec;
}

/* st_mtime is at byte 88 of struct stat on both x86_64 and aarch64. */
static long used_at(void) {
    long st[32];
    if (sys6(SYS_newfstatat, AT_FDCWD, (long)USED_FILE, (long)st, 0, 0, 0) < 0) return 0;
    return st[88 / 8];
}

static void hold_idle(long idle) {
    long since = now_secs();
    for (;;) {
        struct timespec_ t = {30, 0};
        sys6(SYS_ppoll, 0, 0, (long)&t, 0, 8, 0);
        long used = used_at();
        if (used > since) since = used;
        if (now_secs() - since > idle) sys6(SYS_exit_group, 0, 0, 0, 0, 0, 0);
    }
}

/* Opens `/proc/PID/REST` (PID: decimal digits only) with `flags`. */
static int open_proc(const char *pid, const char *rest, long flags) {
    char path[40] = "/proc/";
    int i = 6, n = 0;
    while (pid[n] >= '0' && pid[n] <= '9' && n < 10) path[i++] = pid[n++];
    if (!n || pid[n]) die("bad pid", 0, 2);
    path[i++] = '/';
    while (*rest) path[i++] = *rest++;
    path[i] = 0;
    long fd = sys6(SYS_openat, AT_FDCWD, (long)path, flags | O_CLOEXEC, 0, 0, 0);
    if (fd < 0) die("opening a namespace or the root of the sandbox", fd, 1);
    return (int)fd;
}

/* Opens the network namespace of process `pid`. */
static int open_netns(const char *pid) { return open_proc(pid, "ns/net", O_RDONLY); }

/* Enters the network namespace open as `fd`, and marks the fencer used. */
static void enter_netns_fd(long fd) {
    long r = sys6(SYS_setns, fd, CLONE_NEWNET, 0, 0, 0, 0);
    if (r < 0) die("entering the sandbox's network namespace", r, 1);
    sys6(SYS_close, fd, 0, 0, 0, 0, 0);
    long u = sys6(SYS_openat, AT_FDCWD, (long)USED_FILE, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
                  0600, 0, 0);
    if (u >= 0) sys6(SYS_close, u, 0, 0, 0, 0, 0);
}

/* Enters the network namespace of process `pid` (decimal digits only). */
static void enter_netns(const char *pid) { enter_netns_fd(open_netns(pid)); }

/* ---- plug: the sandbox's interface on the sandboxes' bridge ---- */

#define AF_UNSPEC 0
#define SOCK_DGRAM 2
#define SOCK_STREAM 1
#define RTM_NEWLINK 16
#define RTM_DELLINK 17
#define IFF_UP 0x1
#define IFLA_IFNAME 3
#define IFLA_MASTER 10
#define IFLA_LINKINFO 18
#define IFLA_NET_NS_FD 28
#define IFLA_INFO_KIND 1
#define IFLA_INFO_DATA 2
#define VETH_INFO_PEER 1
#define SIOCGIFINDEX 0x8933
#define IFLA_AF_SPEC 26
#define IFLA_INET6_ADDR_GEN_MODE 8
#define IN6_ADDR_GEN_MODE_NONE 1
#define EAFNOSUPPORT 97
#define EEXIST 17
#define ENOENT 2
#define ESRCH 3
#define ENODEV 19

struct ifinfomsg {
    u8 family, pad;
    u16 type;
    int index;
    u32 flags, change;
};

static u8 msg[1024];
static u32 mlen;

static void msg_start(u16 type, u16 flags) {
    memset(msg, 0, sizeof msg);
    struct nlmsghdr *h = (struct nlmsghdr *)msg;
    h->type = type;
    h->flags = NLM_F_REQUEST | NLM_F_ACK | flags;
    h->seq = ++seq;
    mlen = sizeof *h;
}
static void msg_raw(const void *p, u32 n) {
    if (mlen + n > sizeof msg) die("a netlink message too long", 0, 2);
    memcpy(msg + mlen, p, n);
    mlen = ALIGN4(mlen + n);
}
static void msg_attr(u16 type, const void *p, u32 n) {
    struct rtattr a = {(u16)(sizeof a + n), type};
    if (mlen + sizeof a + n > sizeof msg) die("a netlink message too long", 0, 2);
    memcpy(msg + mlen, &a, sizeof a);
    memcpy(msg + mlen + sizeof a, p, n);
    mlen = ALIGN4(mlen + sizeof a + n);
}
static u32 msg_nest(u16 type) {
    u32 at = mlen;
    msg_attr(type, 0, 0);
    return at;
}
static void msg_nest_end(u32 at) { ((struct rtattr *)(msg + at))->len = (u16)(mlen - at); }
static void msg_str(u16 type, const char *s) { msg_attr(type, s, (u32)slen(s) + 1); }
/* Sends the message on `fd`; returns the kernel's answer (0 or a negative errno). */
static int msg_send(int fd) {
    ((struct nlmsghdr *)msg)->len = mlen;
    nl_send(fd, msg, mlen);
    long n = nl_recv(fd);
    struct nlmsghdr *h = (struct nlmsghdr *)rbuf;
    if (n < (long)(sizeof *h + sizeof(int)) || h->type != NLMSG_ERROR) die("no answer from netlink", 0, 1);
    return *(int *)(rbuf + sizeof *h);
}

/* The index of interface `name` in the current network namespace (0: none). */
static int if_index(const char *name) {
    struct {
        char name[16];
        int index;
        u8 pad[20];
    } r;
    memset(&r, 0, sizeof r);
    size_t n = slen(name);
    if (n > 15) die("an interface name over 15 bytes", 0, 2);
    memcpy(r.name, name, n);
    long s = sys6(SYS_socket, AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0, 0, 0, 0);
    if (s < 0) die("opening a socket", s, 1);
    long e = sys6(SYS_ioctl, s, SIOCGIFINDEX, (long)&r, 0, 0, 0);
    sys6(SYS_close, s, 0, 0, 0, 0, 0);
    if (e == -ENODEV) return 0;
    if (e < 0) die("looking up an interface", e, 1);
    return r.index;
}

static void hex8(char *p, u32 v) {
    static const char d[] = "0123456789abcdef";
    for (int i = 7; i >= 0; i--, v >>= 4) p[i] = d[v & 15];
}

/*
 * Makes a veth pair: `kx<address in hex>` on the host, a port of `bridge` and up, and
 * `eth0` in the namespace `nsfd`, up. The host end's name is the address's lease: the
 * kernel keeps interface names unique, and the pair goes when the sandbox's namespace
 * does. `eth0` is brought up once it has its address. Tries `count` addresses of the subnet from index `first` on, starting at `start`;
 * returns the address taken.
 */
static u32 make_veth(int fd, int bridge, long nsfd, u32 net, long first, long count, long start) {
    for (long tried = 0; tried < count && tried < 4096; tried++) {
        u32 addr = net + (u32)(first + (start + tried) % count);
        char host[11] = "kx";
        hex8(host + 2, addr);
        host[10] = 0;
        msg_start(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        struct ifinfomsg ifi = {AF_UNSPEC, 0, 0, 0, IFF_UP, IFF_UP};
        msg_raw(&ifi, sizeof ifi);
        msg_str(IFLA_IFNAME, host);
        u32 master = (u32)bridge;
        msg_attr(IFLA_MASTER, &master, 4);
        u32 info = msg_nest(IFLA_LINKINFO);
        msg_str(IFLA_INFO_KIND, "veth");
        u32 data = msg_nest(IFLA_INFO_DATA);
        u32 peer = msg_nest(VETH_INFO_PEER);
        /* Down: the kernel cannot bring a veth up before its pair is complete. */
        struct ifinfomsg down = {AF_UNSPEC, 0, 0, 0, 0, 0};
        msg_raw(&down, sizeof down);
        msg_str(IFLA_IFNAME, "eth0");
        u32 ns = (u32)nsfd;
        msg_attr(IFLA_NET_NS_FD, &ns, 4);
        msg_nest_end(peer);
        msg_nest_end(data);
        msg_nest_end(info);
        int err = msg_send(fd);
        if (!err) return addr;
        if (err != -EEXIST) die("making the sandbox's interface", err, 1);
        /* The address is another sandbox's, unless it was the sandbox's own `eth0`. */
        if (!if_index(host)) die("the sandbox has an interface already", 0, 1);
    }
    die("no free address for the sandbox on its network", 0, 1);
    return 0;
}

/*
 * The bridge's port for a sandbox is isolated: the bridge forwards nothing between two
 * isolated ports (unicast, broadcast, multicast, ARP alike), so no frame of one sandbox
 * reaches another, whatever the sandbox sends.
 */
#define RTM_SETLINK 19
#define AF_BRIDGE 7
#define IFLA_PROTINFO 12
#define IFLA_BRPORT_ISOLATED 33
#define NLA_F_NESTED 0x8000

static void isolate_port(int fd, int port) {
    msg_start(RTM_SETLINK, 0);
    struct ifinfomsg ifi = {AF_BRIDGE, 0, 0, port, 0, 0};
    msg_raw(&ifi, sizeof ifi);
    u32 info = msg_nest(IFLA_PROTINFO | NLA_F_NESTED);
    u8 on = 1;
    msg_attr(IFLA_BRPORT_ISOLATED, &on, 1);
    msg_nest_end(info);
    int err = msg_send(fd);
    if (err) die("isolating the sandbox's port on the bridge", err, 1);
}

/*
 * What a sandbox sends is filtered in nftables twice, each a table `inet kodx` replaced
 * whole and atomically when a sandbox is plugged:
 *   - on the engine's host, a base chain per bridge on the input hook drops what comes in
 *     from the bridge for the host that is not unicast IPv4: broadcast and multicast
 *     frames, packets to 224.0.0.0/3 (multicast, reserved, 255.255.255.255) or to the
 *     subnet's broadcast address, IPv6 ([`host_filter`]);
 *   - in the sandbox's own network namespace, the output hook drops IPv6, broadcast and
 *     multicast, and anything for its subnet (the host's side of the bridge, the other
 *     sandboxes) unless the operator allows it ([`sandbox_filter`]). A sandbox's routes
 *     keep its connects off the host already; this holds for what routes do not cover: a
 *     socket bound to the sandbox's address sending to 255.255.255.255 or the subnet's
 *     broadcast address, and MSG_DONTROUTE, which skips the unreachable routes for
 *     addresses on the link. The sandbox's processes have neither CAP_NET_ADMIN (to change
 *     the table) nor CAP_NET_RAW (to send around it).
 */
#define NETLINK_NETFILTER 12
#define NFNL_SUBSYS_NFTABLES 10
#define NFNL_MSG_BATCH_BEGIN 16
#define NFNL_MSG_BATCH_END 17
#define NFT_MSG_NEWTABLE 0
#define NFT_MSG_NEWCHAIN 3
#define NFT_MSG_NEWRULE 6
#define NFT_MSG_DELRULE 8
#define NLM_F_APPEND 0x800
#define NFPROTO_INET 1
#define NFPROTO_IPV4 2
#define NF_INET_LOCAL_IN 1
#define NF_INET_LOCAL_OUT 3
#define NF_DROP 0
#define NF_ACCEPT 1

static u8 nb[32768];
static u32 nbl, nb_at, nb_acks;

static void nb_put(const void *p, u32 n) {
    if (nbl + n > sizeof nb) die("the bridge's filter is too long (too many allowed ranges)", 0, 2);
    memcpy(nb + nbl, p, n);
    memset(nb + nbl + n, 0, ALIGN4(n) - n);
    nbl += ALIGN4(n);
}
static void nb_attr(u16 type, const void *p, u32 n) {
    struct rtattr a = {(u16)(sizeof a + n), type};
    if (nbl + sizeof a + n + 4 > sizeof nb) die("the bridge's filter is too long", 0, 2);
    memcpy(nb + nbl, &a, sizeof a);
    nbl += sizeof a;
    memcpy(nb + nbl, p, n);
    memset(nb + nbl + n, 0, ALIGN4(n) - n);
    nbl += ALIGN4(n);
}
static void nb_u32(u16 type, u32 v) {
    u8 be[4] = {(u8)(v >> 24), (u8)(v >> 16), (u8)(v >> 8), (u8)v};
    nb_attr(type, be, 4);
}
static void nb_str(u16 type, const char *s) { nb_attr(type, s, (u32)slen(s) + 1); }
static u32 nb_nest(u16 type) {
    u32 at = nbl;
    nb_attr(type | NLA_F_NESTED, 0, 0);
    return at;
}
static void nb_end(u32 at) { ((struct rtattr *)(nb + at))->len = (u16)(nbl - at); }
/* A message of the batch: header and nfgenmsg; NLM_F_ACK unless it begins or ends it. */
static void nb_msg(u16 type, u16 flags, u8 family) {
    nb_at = nbl;
    int batch = type == NFNL_MSG_BATCH_BEGIN || type == NFNL_MSG_BATCH_END;
    struct nlmsghdr h = {0, type, (u16)(NLM_F_REQUEST | flags | (batch ? 0 : NLM_F_ACK)), ++seq, 0};
    nb_put(&h, sizeof h);
    u8 gen[4] = {family, 0, 0, batch ? NFNL_SUBSYS_NFTABLES : 0};
    nb_put(gen, 4);
    if (!batch) nb_acks++;
}
static void nb_msg_end(void) { ((struct nlmsghdr *)(nb + nb_at))->len = nbl - nb_at; }
static u16 nft_type(u16 msg) { return (u16)(NFNL_SUBSYS_NFTABLES << 8 | msg); }

/* Expressions: each a list element with the expression's name and its data. */
static u32 ex_data;
static u32 ex_elem;
static void ex_begin(const char *name) {
    ex_elem = nb_nest(1 /* NFTA_LIST_ELEM */);
    nb_str(1 /* NFTA_EXPR_NAME */, name);
    ex_data = nb_nest(2 /* NFTA_EXPR_DATA */);
}
static void ex_end(void) {
    nb_end(ex_data);
    nb_end(ex_elem);
}
/* meta KEY -> register 1 */
static void ex_meta(u32 key) {
    ex_begin("meta");
    nb_u32(1 /* NFTA_META_DREG */, 1);
    nb_u32(2 /* NFTA_META_KEY */, key);
    ex_end();
}
/* register 1 OP value (0: ==, 1: !=) */
static void ex_cmp(u32 op, const void *v, u32 n) {
    ex_begin("cmp");
    nb_u32(1 /* NFTA_CMP_SREG */, 1);
    nb_u32(2 /* NFTA_CMP_OP */, op);
    u32 d = nb_nest(3 /* NFTA_CMP_DATA */);
    nb_attr(1 /* NFTA_DATA_VALUE */, v, n);
    nb_end(d);
    ex_end();
}
/* the IPv4 destination address -> register 1, masked with `mask` */
static void ex_daddr(u32 mask) {
    ex_begin("payload");
    nb_u32(1 /* NFTA_PAYLOAD_DREG */, 1);
    nb_u32(2 /* NFTA_PAYLOAD_BASE */, 1 /* network header */);
    nb_u32(3 /* NFTA_PAYLOAD_OFFSET */, 16);
    nb_u32(4 /* NFTA_PAYLOAD_LEN */, 4);
    ex_end();
    if (mask == ~0u) return;
    ex_begin("bitwise");
    nb_u32(1 /* NFTA_BITWISE_SREG */, 1);
    nb_u32(2 /* NFTA_BITWISE_DREG */, 1);
    nb_u32(3 /* NFTA_BITWISE_LEN */, 4);
    u8 m[4] = {(u8)(mask >> 24), (u8)(mask >> 16), (u8)(mask >> 8), (u8)mask}, zero[4] = {0};
    u32 d = nb_nest(4 /* NFTA_BITWISE_MASK */);
    nb_attr(1, m, 4);
    nb_end(d);
    d = nb_nest(5 /* NFTA_BITWISE_XOR */);
    nb_attr(1, zero, 4);
    nb_end(d);
    ex_end();
}
static void ex_daddr_is(u32 mask, u32 value) {
    ex_daddr(mask);
    u8 v[4] = {(u8)(value >> 24), (u8)(value >> 16), (u8)(value >> 8), (u8)value};
    ex_cmp(0, v, 4);
}
static void ex_verdict(u32 code) {
    ex_begin("immediate");
    nb_u32(1 /* NFTA_IMMEDIATE_DREG */, 0 /* the verdict register */);
    u32 d = nb_nest(2 /* NFTA_IMMEDIATE_DATA */);
    u32 v = nb_nest(2 /* NFTA_DATA_VERDICT */);
    nb_u32(1 /* NFTA_VERDICT_CODE */, code);
    nb_end(v);
    nb_end(d);
    ex_end();
}

static char nft_chain[16], nft_iif[16];
static u32 rule_exprs;
/* A rule of the chain being written; with an input interface set, only for packets that
 * came in on it. */
static void rule_begin(void) {
    nb_msg(nft_type(NFT_MSG_NEWRULE), NLM_F_CREATE | NLM_F_APPEND, NFPROTO_INET);
    nb_str(1 /* NFTA_RULE_TABLE */, "kodx");
    nb_str(2 /* NFTA_RULE_CHAIN */, nft_chain);
    rule_exprs = nb_nest(4 /* NFTA_RULE_EXPRESSIONS */);
    if (nft_iif[0]) {
        ex_meta(6 /* NFT_META_IIFNAME */);
        ex_cmp(0, nft_iif, 16);
    }
}
static void rule_end(u32 verdict) {
    ex_verdict(verdict);
    nb_end(rule_exprs);
    nb_msg_end();
}
static void name16(char d[16], const char *s) {
    size_t n = slen(s);
    if (n > 15) die("an interface or chain name over 15 bytes", 0, 2);
    memset(d, 0, 16);
    memcpy(d, s, n);
}

/* Starts the batch that replaces base chain `chain` (on `hook`) of table `inet kodx`. */
static void nft_begin(const char *chain, u32 hook) {
    name16(nft_chain, chain);
    nbl = 0, nb_acks = 0;
    nb_msg(NFNL_MSG_BATCH_BEGIN, 0, 0);
    nb_msg_end();
    nb_msg(nft_type(NFT_MSG_NEWTABLE), NLM_F_CREATE, NFPROTO_INET);
    nb_str(1 /* NFTA_TABLE_NAME */, "kodx");
    nb_msg_end();
    nb_msg(nft_type(NFT_MSG_NEWCHAIN), NLM_F_CREATE, NFPROTO_INET);
    nb_str(1 /* NFTA_CHAIN_TABLE */, "kodx");
    nb_str(3 /* NFTA_CHAIN_NAME */, nft_chain);
    u32 h = nb_nest(4 /* NFTA_CHAIN_HOOK */);
    nb_u32(1 /* NFTA_HOOK_HOOKNUM */, hook);
    nb_u32(2 /* NFTA_HOOK_PRIORITY */, 0);
    nb_end(h);
    nb_u32(5 /* NFTA_CHAIN_POLICY */, NF_ACCEPT);
    nb_str(7 /* NFTA_CHAIN_TYPE */, "filter");
    nb_msg_end();
    /* The chain's rules, all of them: the batch writes them anew. */
    nb_msg(nft_type(NFT_MSG_DELRULE), 0, NFPROTO_INET);
    nb_str(1 /* NFTA_RULE_TABLE */, "kodx");
    nb_str(2 /* NFTA_RULE_CHAIN */, nft_chain);
    nb_msg_end();
}

/* Sends the batch (applied whole or not at all) in the current network namespace. */
static void nft_commit(const char *what) {
    nb_msg(NFNL_MSG_BATCH_END, 0, 0);
    nb_msg_end();
    long fd = sys6(SYS_socket, AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_NETFILTER, 0, 0, 0);
    if (fd < 0) die("opening a netfilter socket", fd, 1);
    nl_send((int)fd, nb, nbl);
    while (nb_acks) {
        long got = nl_recv((int)fd);
        for (long off = 0; off + (long)sizeof(struct nlmsghdr) <= got;) {
            struct nlmsghdr *h = (struct nlmsghdr *)(rbuf + off);
            if (h->len < sizeof *h || off + (long)h->len > got) die("a bad answer from netfilter", 0, 1);
            if (h->type == NLMSG_ERROR) {
                int err = *(int *)(rbuf + off + sizeof *h);
                if (err) die(what, err, 1);
                nb_acks--;
            }
            off += ALIGN4(h->len);
        }
    }
    sys6(SYS_close, fd, 0, 0, 0, 0, 0);
}

/* Drops what is not unicast IPv4 outside 224.0.0.0/3 and the subnet's broadcast address. */
static void drop_not_unicast_v4(u32 bcast, int frames) {
    rule_begin();
    ex_meta(15 /* NFT_META_NFPROTO */);
    u8 v4 = NFPROTO_IPV4;
    ex_cmp(1, &v4, 1);
    rule_end(NF_DROP);
    if (frames) {
        rule_begin();
        ex_meta(19 /* NFT_META_PKTTYPE */);
        u8 host = 0 /* PACKET_HOST */;
        ex_cmp(1, &host, 1);
        rule_end(NF_DROP);
    }
    rule_begin();
    ex_daddr_is(0xe0000000u, 0xe0000000u);
    rule_end(NF_DROP);
    rule_begin();
    ex_daddr_is(~0u, bcast);
    rule_end(NF_DROP);
}

/* Starts the batch that writes the sandbox's output chain anew, its first rule letting
 * loopback through as it is. */
static void out_chain_from_loopback(void) {
    nft_begin("out", NF_INET_LOCAL_OUT);
    memset(nft_iif, 0, sizeof nft_iif);
    char lo[16];
    name16(lo, "lo");
    rule_begin();
    ex_meta(7 /* NFT_META_OIFNAME */);
    ex_cmp(0, lo, 16);
    rule_end(NF_ACCEPT);
}

/* The engine host's input from `bridge` (subnet `net`/`mask`): unicast IPv4 only. */
static void host_filter(const char *bridge, u32 net, u32 mask) {
    nft_begin(bridge, NF_INET_LOCAL_IN);
    name16(nft_iif, bridge);
    drop_not_unicast_v4((net & mask) | ~mask, 1);
    nft_commit("filtering what sandboxes send to the engine's host (nftables)");
}

/* The sandbox's output (run in its network namespace): loopback as it is; unicast IPv4
 * only; nothing for its subnet but what an allowed range (`a<addr>/<prefix>` specs)
 * covers. */
static void sandbox_filter(u32 net, u32 mask, char **specs, long n) {
    out_chain_from_loopback();
    drop_not_unicast_v4((net & mask) | ~mask, 0);
    for (long k = 0; k < n; k++) {
        u8 a[4];
        const char *p = specs[k][0] == 'a' ? parse_addr(specs[k] + 1, a) : 0;
        if (!p || *p != '/') continue;
        long prefix = parse_dec(p + 1);
        if (prefix > 32) die("bad allowed range", 0, 2);
        u32 m = prefix ? ~0u << (32 - prefix) : 0;
        u32 base = (u32)a[0] << 24 | (u32)a[1] << 16 | (u32)a[2] << 8 | a[3];
        rule_begin();
        if (m) ex_daddr_is(m, base & m);
        rule_end(NF_ACCEPT);
    }
    rule_begin();
    ex_daddr_is(mask, net & mask);
    rule_end(NF_DROP);
    nft_commit("filtering what the sandbox sends (nftables in its namespace)");
}

/*
 * plug PID BRIDGE NET/PREFIX GATEWAY FIRST COUNT: the sandbox (PID's network namespace,
 * with no interface but loopback) gets an interface on BRIDGE with an address of NET, the
 * address index within the subnet taken from FIRST..FIRST+COUNT-1, and a default route via
 * GATEWAY. The caller then adds the fence's routes, still in the sandbox's namespace.
 */
static void plug(long argc, char **argv) {
    u8 netb[4], gwb[4];
    const char *p = parse_addr(argv[4], netb);
    if (!p || *p != '/') die("bad subnet", 0, 2);
    long prefix = parse_dec(p + 1);
    if (prefix < 8 || prefix > 30) die("bad subnet prefix", 0, 2);
    p = parse_addr(argv[5], gwb);
    if (!p || *p) die("bad gateway", 0, 2);
    long first = parse_dec(argv[6]), count = parse_dec(argv[7]);
    long size = 1L << (32 - prefix);
    if (count < 1 || first < 1 || first + count > size - 1) die("bad address range", 0, 2);
    u32 net = (u32)netb[0] << 24 | (u32)netb[1] << 16 | (u32)netb[2] << 8 | netb[3];
    int bridge = if_index(argv[3]);
    if (!bridge) die("the sandboxes' bridge is not on the engine's host", 0, 1);
    int nsfd = open_netns(argv[2]);
    int host = nl_open();
    collect_v4 = 1;
    dump_addrs(host);
    collect_v4 = 0;
    if (host_v4_n == 4096) die("the engine's host has over 4095 addresses", 0, 1);
    plug_net = net, plug_mask = ~0u << (32 - prefix);
    u32 addr = make_veth(host, bridge, nsfd, net, first, count, parse_dec(argv[2]) % count);
    /* Before the sandbox's end is up: nothing it sends gets past the bridge unfiltered. */
    char port[11] = "kx";
    hex8(port + 2, addr);
    port[10] = 0;
    isolate_port(host, if_index(port));
    host_filter(argv[3], net, plug_mask);
    sys6(SYS_close, host, 0, 0, 0, 0, 0);
    enter_netns_fd(nsfd);
    /* Before its interface is up. */
    sandbox_filter(net, plug_mask, argv + 9, argc - 9);
    int fd = nl_open();
    int eth0 = if_index("eth0");
    if (!eth0) die("the sandbox's interface is missing", 0, 1);
    msg_start(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL);
    struct ifaddrmsg ifa = {AF_INET, (u8)prefix, 0, RT_SCOPE_UNIVERSE, (u32)eth0};
    msg_raw(&ifa, sizeof ifa);
    u8 a[4] = {(u8)(addr >> 24), (u8)(addr >> 16), (u8)(addr >> 8), (u8)addr};
    u32 bcast = addr | (u32)(size - 1);
    u8 b[4] = {(u8)(bcast >> 24), (u8)(bcast >> 16), (u8)(bcast >> 8), (u8)bcast};
    msg_attr(IFA_LOCAL, a, 4);
    msg_attr(IFA_ADDRESS, a, 4);
    msg_attr(IFA_BROADCAST, b, 4);
    int err = msg_send(fd);
    if (err) die("giving the sandbox its address", err, 1);
    /* No IPv6 address of its own making, not even link-local (the fence is IPv4's; the
     * engine also turns IPv6 off in a container without a network). A kernel without IPv6
     * says so, and has none to make. */
    msg_start(RTM_NEWLINK, 0);
    struct ifinfomsg nov6 = {AF_UNSPEC, 0, 0, eth0, 0, 0};
    msg_raw(&nov6, sizeof nov6);
    u32 spec = msg_nest(IFLA_AF_SPEC);
    u32 inet6 = msg_nest(AF_INET6);
    u8 none = IN6_ADDR_GEN_MODE_NONE;
    msg_attr(IFLA_INET6_ADDR_GEN_MODE, &none, 1);
    msg_nest_end(inet6);
    msg_nest_end(spec);
    err = msg_send(fd);
    if (err && err != -EAFNOSUPPORT) die("turning IPv6 addresses off on the sandbox's interface", err, 1);
    msg_start(RTM_NEWLINK, 0);
    struct ifinfomsg up = {AF_UNSPEC, 0, 0, eth0, IFF_UP, IFF_UP};
    msg_raw(&up, sizeof up);
    err = msg_send(fd);
    if (err) die("bringing the sandbox's interface up", err, 1);
    char route[] = "g00000000/0/00000000";
    hex8(route + 12, (u32)gwb[0] << 24 | (u32)gwb[1] << 16 | (u32)gwb[2] << 8 | gwb[3]);
    add_route(fd, route);
    sys6(SYS_close, fd, 0, 0, 0, 0, 0);
}

/*
 * The sandbox's resolvers: the `nameserver` lines of its /etc/resolv.conf (the engine
 * wrote the host's there) that the sandbox can reach through its fence, as a UDP connect
 * in its network namespace finds (routes only, nothing is sent); when none is left,
 * `fallback` (comma-separated addresses in hex). Opened through the sandbox's root
 * (`rootfd`, its `/proc/PID/root`) with openat2's RESOLVE_IN_ROOT, so the image's symlinks
 * resolve inside the sandbox and never outside it, without entering its mount namespace
 * (which would take CAP_SYS_CHROOT). The file is left alone when every resolver is
 * reachable.
 */
#define O_RDWR 2
#define O_PATH 010000000
/* openat2(2): the same number on x86_64 and aarch64. */
#define SYS_openat2 437
#define RESOLVE_NO_MAGICLINKS 0x02
#define RESOLVE_IN_ROOT 0x10
static char rc_in[16384], rc_out[16384 + 512];

/* connect(2) of socket `s` to IPv4 address `a`, `port`: the kernel's answer. */
static long connect_v4(long s, const u8 a[4], long port) {
    struct {
        u16 family, port;
        u8 addr[4];
        u8 zero[8];
    } to;
    memset(&to, 0, sizeof to);
    to.family = AF_INET;
    to.port = (u16)((port & 0xff) << 8 | (port >> 8));
    memcpy(to.addr, a, 4);
    return sys6(SYS_connect, s, (long)&to, sizeof to, 0, 0, 0);
}

static int reachable(const u8 a[4]) {
    if (a[0] == 127) return 0;
    long s = sys6(SYS_socket, AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0, 0, 0, 0);
    if (s < 0) die("opening a socket", s, 1);
    long r = connect_v4(s, a, 53);
    sys6(SYS_close, s, 0, 0, 0, 0, 0);
    return r == 0;
}

/* A dotted IPv4 address at `p` (to the end of the word); 0 when it is not one. */
static int dotted(const char *p, const char *end, u8 a[4]) {
    int part = 0;
    long v = -1;
    for (; p <= end; p++) {
        if (p < end && *p >= '0' && *p <= '9') {
            v = (v < 0 ? 0 : v * 10) + (*p - '0');
            if (v > 255) return 0;
        } else if (p == end || *p == '.') {
            if (v < 0 || part > 3) return 0;
            a[part++] = (u8)v;
            v = -1;
            if (p == end) break;
        } else {
            return 0;
        }
    }
    return part == 4;
}

static void out_add(size_t *n, const char *s, size_t len) {
    if (*n + len > sizeof rc_out) die("resolv.conf too long", 0, 1);
    memcpy(rc_out + *n, s, len);
    *n += len;
}

static void fix_resolvers(long rootfd, const char *fallback) {
    struct {
        unsigned long long flags, mode, resolve;
    } how = {O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0, RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS};
    long fd = sys6(SYS_openat2, rootfd, (long)"etc/resolv.conf", (long)&how, sizeof how, 0, 0);
    if (fd < 0) die("opening the sandbox's /etc/resolv.conf", fd, 1);
    long r;
    long len = 0;
    for (;;) {
        long n = sys6(SYS_read, fd, (long)(rc_in + len), (long)(sizeof rc_in - len), 0, 0, 0);
        if (n < 0) die("reading the sandbox's /etc/resolv.conf", n, 1);
        if (n == 0) break;
        len += n;
        if (len == (long)sizeof rc_in) die("the sandbox's /etc/resolv.conf is over 16 KiB", 0, 1);
    }
    size_t outn = 0;
    int kept = 0, dropped = 0;
    for (long i = 0; i < len;) {
        long j = i;
        while (j < len && rc_in[j] != '\n') j++;
        const char *l = rc_in + i;
        long ll = j - i;
        int is_ns = ll > 11 && !memcmp_(l, "nameserver", 10) && (l[10] == ' ' || l[10] == '\t');
        if (is_ns) {
            const char *p = l + 10;
            while (p < l + ll && (*p == ' ' || *p == '\t')) p++;
            const char *e = p;
            while (e < l + ll && *e != ' ' && *e != '\t' && *e != '\r') e++;
            u8 a[4];
            if (dotted(p, e, a) && reachable(a)) {
                kept++;
                out_add(&outn, l, (size_t)ll);
                out_add(&outn, "\n", 1);
            } else {
                dropped++;
            }
        } else {
            out_add(&outn, l, (size_t)ll);
            out_add(&outn, "\n", 1);
        }
        i = j + 1;
    }
    if (!dropped) {
        sys6(SYS_close, fd, 0, 0, 0, 0, 0);
        return;
    }
    for (const char *f = fallback; !kept && *f;) {
        u8 a[4];
        const char *p = parse_addr(f, a);
        if (!p || (*p && *p != ',')) die("bad fallback resolver", 0, 2);
        char line[32] = "nameserver ";
        int n = 11;
        for (int k = 0; k < 4; k++) {
            char d[4];
            int m = 0, v = a[k];
            do d[m++] = (char)('0' + v % 10), v /= 10; while (v);
            while (m) line[n++] = d[--m];
            line[n++] = k < 3 ? '.' : '\n';
        }
        out_add(&outn, line, (size_t)n);
        f = *p ? p + 1 : p;
    }
    r = sys6(SYS_lseek, fd, 0, 0, 0, 0, 0);
    if (r >= 0) r = sys6(SYS_ftruncate, fd, 0, 0, 0, 0, 0);
    for (size_t off = 0; r >= 0 && off < outn; off += (size_t)r)
        r = sys6(SYS_write, fd, (long)(rc_out + off), (long)(outn - off), 0, 0, 0);
    if (r < 0) die("writing the sandbox's /etc/resolv.conf", r, 1);
    sys6(SYS_close, fd, 0, 0, 0, 0, 0);
}

/* Whether the range SPEC (`<kind><addr>/<prefix>…`) of `kind` covers `h`; `wider`: only
 * a range wider than one address counts. */
static int covers(const char *spec, char kind, u32 h, int wider) {
    u8 a[4];
    const char *p = spec[0] == kind ? parse_addr(spec + 1, a) : 0;
    if (!p || *p != '/') return 0;
    long prefix = 0;
    for (p++; *p >= '0' && *p <= '9' && prefix <= 32; p++) prefix = prefix * 10 + (*p - '0');
    if (prefix > 32 || (wider && prefix == 32)) return 0;
    u32 base = (u32)a[0] << 24 | (u32)a[1] << 16 | (u32)a[2] << 8 | a[3];
    u32 mask = prefix ? ~0u << (32 - prefix) : 0;
    return (h & mask) == (base & mask);
}

/*
 * Makes each of the engine host's addresses `plug` read unreachable (a /32 each, loopback
 * aside), unless an allowed range (`a<addr>/<prefix>` among `specs`) covers it, or a wider
 * unreachable route does (off the sandbox's subnet, whose connected route would win).
 */
static void block_host(int fd, char **specs, long n) {
    for (int i = 0; i < host_v4_n; i++) {
        u32 h = host_v4[i];
        if (h >> 24 == 127) continue;
        int skip = 0;
        for (long k = 0; k < n && !skip; k++)
            skip = covers(specs[k], 'a', h, 0) ||
                   ((h & plug_mask) != plug_net && covers(specs[k], 'u', h, 1));
        if (skip) continue;
        char spec[] = "u00000000/32";
        hex8(spec + 1, h);
        int err = route(fd, spec);
        if (err && err != -EEXIST) die("blocking an address of the engine's host", err, 1);
    }
}

/*
 * Makes the sandbox's neighbours on its subnet unreachable: the subnet's two halves as
 * unreachable routes, more specific than the connected one (the sandbox's own address is
 * local and wins; the default route's gateway is resolved on the link, not by a route).
 * The engine's `enable_icc=false` rule does this too where it has one; this holds on an
 * engine without it (`--iptables=false`). An allowed range covering the whole subnet
 * leaves it as it is; one covering the gateway gets the gateway a route of its own.
 */
static void block_peers(int fd, char **specs, long n, u32 gateway) {
    u32 size = ~plug_mask + 1;
    for (long k = 0; k < n; k++)
        if (covers(specs[k], 'a', plug_net, 0) && covers(specs[k], 'a', plug_net + size - 1, 0)) return;
    for (long k = 0; k < n; k++) {
        if (!covers(specs[k], 'a', gateway, 0)) continue;
        char r[] = "g00000000/32/00000000";
        hex8(r + 1, gateway);
        hex8(r + 13, gateway);
        int err = route(fd, r);
        if (err && err != -EEXIST) die("routing the allowed gateway", err, 1);
        break;
    }
    int prefix = 0;
    while (prefix < 32 && (plug_mask << prefix)) prefix++;
    for (u32 half = 0; half < 2; half++) {
        char r[] = "u00000000/00";
        hex8(r + 1, plug_net + half * (size / 2));
        r[10] = (char)('0' + (prefix + 1) / 10);
        r[11] = (char)('0' + (prefix + 1) % 10);
        int err = route(fd, r);
        if (err && err != -EEXIST) die("making the sandbox's neighbours unreachable", err, 1);
    }
}

/*
 * unplug PID SPEC... / unroute PID SPEC...: the routes SPEC (as `routes` takes them; the
 * other specs are skipped) removed, one already gone is fine; with unplug, then the
 * sandbox's interface (and its host end, and the routes through it), none is fine. What
 * takes back an interrupted `plug` (unplug) or `fence` (unroute) with the same SPECs
 * before it runs again: both refuse to add a route or an interface that is there.
 */
static void unplug(const char *pid, char **specs, long n, int iface) {
    enter_netns(pid);
    int fd = nl_open();
    for (long i = 0; i < n; i++) {
        if (specs[i][0] != 'u' && specs[i][0] != 'g') continue;
        int err = route_op(fd, specs[i], 1);
        if (err && err != -ESRCH && err != -ENOENT) die("removing a route of the sandbox", err, 1);
    }
    int eth0 = iface ? if_index("eth0") : 0;
    if (eth0) {
        msg_start(RTM_DELLINK, 0);
        struct ifinfomsg ifi = {AF_UNSPEC, 0, 0, eth0, 0, 0};
        msg_raw(&ifi, sizeof ifi);
        int err = msg_send(fd);
        if (err && err != -ENODEV) die("removing the sandbox's interface", err, 1);
    }
    sys6(SYS_close, fd, 0, 0, 0, 0, 0);
}

/*
 * narrow PID|- GATEWAY PORT DROP...: the sandbox (PID's network namespace, or this process's
 * with `-`) keeps its interface but reaches nothing but GATEWAY (8 hex digits) on TCP PORT,
 * kodx's egress proxy: its output filter is replaced by "loopback, then that, nothing
 * else", and the routes DROP (route specs, as `routes` takes them: its default route, the
 * gateway's unreachable /32) are removed, so that every other connect fails at once
 * instead of waiting for a timeout. A route already gone is fine.
 */
static void narrow(long argc, char **argv) {
    if (!(argv[2][0] == '-' && !argv[2][1])) enter_netns(argv[2]);
    u8 gw[4];
    const char *p = parse_addr(argv[3], gw);
    if (!p || *p) die("bad gateway", 0, 2);
    long port = parse_dec(argv[4]);
    if (port < 1 || port > 65535) die("bad port", 0, 2);
    out_chain_from_loopback();
    rule_begin();
    ex_meta(15 /* NFT_META_NFPROTO */);
    u8 v4 = NFPROTO_IPV4;
    ex_cmp(0, &v4, 1);
    ex_daddr_is(~0u, (u32)gw[0] << 24 | (u32)gw[1] << 16 | (u32)gw[2] << 8 | gw[3]);
    ex_meta(16 /* NFT_META_L4PROTO */);
    u8 tcp = 6;
    ex_cmp(0, &tcp, 1);
    ex_begin("payload");
    nb_u32(1 /* NFTA_PAYLOAD_DREG */, 1);
    nb_u32(2 /* NFTA_PAYLOAD_BASE */, 2 /* transport header */);
    nb_u32(3 /* NFTA_PAYLOAD_OFFSET */, 2);
    nb_u32(4 /* NFTA_PAYLOAD_LEN */, 2);
    ex_end();
    u8 be[2] = {(u8)(port >> 8), (u8)port};
    ex_cmp(0, be, 2);
    rule_end(NF_ACCEPT);
    rule_begin();
    rule_end(NF_DROP);
    nft_commit("narrowing the sandbox's network to kodx's egress proxy (nftables)");
    int fd = nl_open();
    for (long i = 5; i < argc; i++) {
        int err = route_op(fd, argv[i], 1);
        if (err && err != -ESRCH && err != -ENOENT) die("removing a route of the sandbox", err, 1);
    }
    /* The gateway on its own link: a plugged sandbox's neighbours (its subnet's halves) are
     * unreachable routes, and the gateway is in one of them. */
    int eth0 = if_index("eth0");
    if (!eth0) die("the sandbox's interface is missing", 0, 1);
    msg_start(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE);
    struct rtmsg r = {AF_INET, 32, 0, 0, RT_TABLE_MAIN, RTPROT_STATIC, RT_SCOPE_LINK, RTN_UNICAST, 0};
    msg_raw(&r, sizeof r);
    msg_attr(RTA_DST, gw, 4);
    u32 oif = (u32)eth0;
    msg_attr(RTA_OIF, &oif, 4);
    int err = msg_send(fd);
    if (err) die("routing the sandbox to the egress proxy", err, 1);
    sys6(SYS_close, fd, 0, 0, 0, 0, 0);
}

/*
 * probe ADDR PORT: asks an HTTP proxy at ADDR (8 hex digits) on TCP PORT for
 * http://kodx-doctor.invalid/ and prints the first line of its answer (or why it could not),
 * within 5 s: `kodx doctor` runs it in a sandbox narrowed to kodx's egress proxy, whose
 * image may have no HTTP client of its own.
 */
static void probe(const char *addr, const char *port_s) {
    u8 a[4];
    const char *p = parse_addr(addr, a);
    long port = parse_dec(port_s);
    if (!p || *p || port < 1 || port > 65535) die("bad address or port", 0, 2);
    long s = sys6(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0, 0, 0, 0);
    if (s < 0) die("probe: opening a socket", s, 1);
    struct { long sec, usec; } tv = {5, 0};
    sys6(SYS_setsockopt, s, 1 /* SOL_SOCKET */, 21 /* SO_SNDTIMEO */, (long)&tv, sizeof tv, 0);
    sys6(SYS_setsockopt, s, 1 /* SOL_SOCKET */, 20 /* SO_RCVTIMEO */, (long)&tv, sizeof tv, 0);
    long r = connect_v4(s, a, port);
    if (r < 0) die("probe: connecting", r, 1);
    static const char req[] = "GET http://kodx-doctor.invalid/ HTTP/1.0\r\nHost: kodx-doctor.invalid\r\n\r\n";
    r = sys6(SYS_sendto, s, (long)req, sizeof req - 1, 0, 0, 0);
    if (r < 0) die("probe: sending", r, 1);
    char line[128];
    long n = 0;
    while (n < (long)sizeof line - 1) {
        r = sys6(SYS_read, s, (long)(line + n), 1, 0, 0, 0);
        if (r == -4) continue;
        if (r < 0) die("probe: reading the answer", r, 1);
        if (r == 0 || line[n] == '\r' || line[n] == '\n') break;
        n++;
    }
    if (n == 0) die("probe: the proxy closed the connection without an answer", 0, 1);
    line[n] = 0;
    put(line);
    put("\n");
    flush(1);
    sys6(SYS_exit_group, 0, 0, 0, 0, 0, 0);
}

/* struct termios as the kernel's TCGETS/TCSETS take it (the same on x86_64 and aarch64). */
struct termios_ {
    u32 iflag, oflag, cflag, lflag;
    u8 line, cc[19];
};
#define TCGETS 0x5401
#define TCSETS 0x5402

static char gate_line[4096];

/* Waits for one line on stdin, echo off, then runs it with /bin/sh -c. */
static void gate(char **envp) {
    struct termios_ t;
    int tty = sys6(SYS_ioctl, 0, TCGETS, (long)&t, 0, 0, 0) == 0;
    u32 lflag = t.lflag;
    if (tty) {
        t.lflag &= ~(u32)(0x8 | 0x40); /* ECHO, ECHONL */
        sys6(SYS_ioctl, 0, TCSETS, (long)&t, 0, 0, 0);
    }
    size_t n = 0;
    for (;;) {
        if (n == sizeof gate_line - 1) die("gate: the line is too long", 0, 2);
        long r = sys6(SYS_read, 0, (long)(gate_line + n), 1, 0, 0, 0);
        if (r == -4 /* EINTR */) continue;
        if (r < 0) die("gate: reading the line", r, 1);
        if (r == 0) die("gate: no line before the end of input", 0, 1);
        if (gate_line[n] == '\n') break;
        n++;
    }
    gate_line[n] = 0;
    if (tty) {
        t.lflag = lflag;
        sys6(SYS_ioctl, 0, TCSETS, (long)&t, 0, 0, 0);
    }
    char *argv[] = {"/bin/sh", "-c", gate_line, 0};
    long r = sys6(SYS_execve, (long)"/bin/sh", (long)argv, (long)envp, 0, 0, 0);
    die("gate: running /bin/sh", r, 127);
}


static int streq(const char *a, const char *b) {
    while (*a && *a == *b) a++, b++;
    return *a == *b;
}


/* ---- snapshot ---- */

#define S_IFMT 0170000
#define S_IFDIR 0040000
#define S_IFREG 0100000
#define S_IFLNK 0120000
#define S_IFIFO 0010000
#define S_IFCHR 0020000
#define S_IFBLK 0060000
#define PATH_MAX_ 4096

struct kstat {
    long w[18];
};
static u32 st_mode(const struct kstat *st) { return *(const u32 *)((const u8 *)st + ST_MODE_AT); }
static long st_size(const struct kstat *st) { return st->w[48 / 8]; }
static long st_mtime(const struct kstat *st) { return st->w[88 / 8]; }
static long st_ctime(const struct kstat *st) { return st->w[104 / 8]; }
static long st_ctime_ns(const struct kstat *st) { return st->w[112 / 8]; }

static long since_sec, since_nsec;
static u8 tarbuf[65536];
static size_t tarlen;
/* Directory listings of the path being walked, one after another. */
static char arena[16 << 20];
static size_t arena_used;
static char path[PATH_MAX_ + 256];
static u8 dents[32768];
static size_t root_plen;

static void tar_flush(void) {
    size_t off = 0;
    while (off < tarlen) {
        long n = sys6(SYS_write, 1, (long)(tarbuf + off), (long)(tarlen - off), 0, 0, 0);
        if (n == -4) continue;
        if (n <= 0) die("snapshot: writing the tar", n, 1);
        off += (size_t)n;
    }
    tarlen = 0;
}
static void tar_put(const void *p, size_t n) {
    const u8 *q = p;
    while (n) {
        size_t k = sizeof tarbuf - tarlen;
        if (k > n) k = n;
        memcpy(tarbuf + tarlen, q, k);
        tarlen += k, q += k, n -= k;
        if (tarlen == sizeof tarbuf) tar_flush();
    }
}
static void tar_pad(unsigned long n) {
    static const u8 zero[512];
    if (n % 512) tar_put(zero, 512 - n % 512);
}
static void octal(char *field, int width, unsigned long v) {
    /* width - 1 digits and a NUL */
    field[width - 1] = 0;
    for (int i = width - 2; i >= 0; i--) field[i] = (char)('0' + (v & 7)), v >>= 3;
}
/* One PAX record "LEN key=value\n" into p; returns its length. */
static size_t pax_record(char *p, const char *key, const char *value, size_t vlen) {
    size_t klen = slen(key), body = 1 + klen + 1 + vlen + 1, len = body + 1;
    while (1) {
        size_t digits = 0, t = len;
        do digits++, t /= 10; while (t);
        if (body + digits == len) break;
        len = body + digits;
    }
    size_t t = len, digits = 0;
    do digits++, t /= 10; while (t);
    for (size_t i = digits, v = len; i > 0; i--, v /= 10) p[i - 1] = (char)('0' + v % 10);
    size_t o = digits;
    p[o++] = ' ';
    memcpy(p + o, key, klen), o += klen;
    p[o++] = '=';
    memcpy(p + o, value, vlen), o += vlen;
    p[o++] = '\n';
    return o;
}
static void header(const char *name, size_t nlen, char type, u32 mode, unsigned long size,
                   long mtime, const char *link, size_t llen) {
    static char pax[2 * (PATH_MAX_ + 64)];
    u8 h[512];
    if (nlen > 100 || llen > 100) {
        size_t plen = 0;
        if (nlen > 100) plen += pax_record(pax + plen, "path", name, nlen);
        if (llen > 100) plen += pax_record(pax + plen, "linkpath", link, llen);
        header("././@PaxHeader", 14, 'x', 0644, plen, 0, 0, 0);
        tar_put(pax, plen);
        tar_pad(plen);
    }
    memset(h, 0, sizeof h);
    memcpy(h, name, nlen > 100 ? 100 : nlen);
    octal((char *)h + 100, 8, mode & 07777);
    octal((char *)h + 108, 8, 0);
    octal((char *)h + 116, 8, 0);
    octal((char *)h + 124, 12, size);
    octal((char *)h + 136, 12, mtime < 0 ? 0 : (unsigned long)mtime);
    memset(h + 148, ' ', 8);
    h[156] = (u8)type;
    if (link) memcpy(h + 157, link, llen > 100 ? 100 : llen);
    memcpy(h + 257, "ustar", 6);
    memcpy(h + 263, "00", 2);
    unsigned long sum = 0;
    for (int i = 0; i < 512; i++) sum += h[i];
    octal((char *)h + 148, 7, sum);
    tar_put(h, 512);
}

static int older_than_marker(const struct kstat *st) {
    long s = st_ctime(st), ns = st_ctime_ns(st);
    return s < since_sec || (s == since_sec && ns < since_nsec);
}

/* Streams exactly `size` bytes of the regular file `name` in directory `dfd`. */
static void file_data(int dfd, const char *name, unsigned long size) {
    long fd = sys6(SYS_openat, dfd, (long)name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW, 0, 0, 0);
    if (fd < 0) die("snapshot: opening a file", fd, 1);
    unsigned long left = size;
    while (left) {
        if (tarlen == sizeof tarbuf) tar_flush();
        size_t room = sizeof tarbuf - tarlen;
        if (room > left) room = left;
        long n = sys6(SYS_read, fd, (long)(tarbuf + tarlen), (long)room, 0, 0, 0);
        if (n == -4) continue;
        if (n < 0) die("snapshot: reading a file", n, 1);
        if (n == 0) die("snapshot: a file shrank while it was read", 0, 1);
        tarlen += (size_t)n, left -= (unsigned long)n;
    }
    sys6(SYS_close, fd, 0, 0, 0, 0, 0);
    tar_pad(size);
}

static int is_gitignore(const char *n) {
    return streq(n, ".gitignore");
}

/* One entry `name` of directory `dfd`; `path` holds its tar name (length plen). `stable`:
 * no directory between the root and this entry changed since the marker, so none was
 * renamed (a rename changes the moved inode), and a file whose own inode did not change
 * either is the one copied in at this path. (A directory whose entries changed cannot be
 * told from a renamed one: what is below it goes whole.) */
static void walk_dir(int dfd, size_t plen, int stable);
static void entry(int dfd, const char *name, size_t plen, int stable) {
    struct kstat st;
    long r = sys6(SYS_newfstatat, dfd, (long)name, (long)&st, 0x100 /* AT_SYMLINK_NOFOLLOW */, 0, 0);
    if (r == -2) return; /* gone since the listing */
    if (r < 0) die("snapshot: reading an entry's metadata", r, 1);
    u32 mode = st_mode(&st);
    switch (mode & S_IFMT) {
    case S_IFDIR: {
        path[plen] = '/';
        header(path, plen + 1, '5', mode, 0, st_mtime(&st), 0, 0);
        long fd = sys6(SYS_openat, dfd, (long)name, O_RDONLY | O_CLOEXEC | O_DIRECTORY | O_NOFOLLOW, 0, 0, 0);
        if (fd < 0) die("snapshot: opening a directory", fd, 1);
        walk_dir((int)fd, plen + 1, stable && older_than_marker(&st));
        sys6(SYS_close, fd, 0, 0, 0, 0, 0);
        break;
    }
    case S_IFREG: {
        unsigned long size = (unsigned long)st_size(&st);
        if (stable && older_than_marker(&st) && !is_gitignore(name)) {
            header(path, plen, 'U', mode, 0, st_mtime(&st), 0, 0);
        } else {
            if (size >= 077777777777UL) die("snapshot: a file of 8 GiB or more", 0, 1);
            header(path, plen, '0', mode, size, st_mtime(&st), 0, 0);
            file_data(dfd, name, size);
        }
        break;
    }
    case S_IFLNK: {
        static char target[PATH_MAX_ + 1];
        long n = sys6(SYS_readlinkat, dfd, (long)name, (long)target, PATH_MAX_, 0, 0);
        if (n < 0) die("snapshot: reading a symlink", n, 1);
        if (n >= PATH_MAX_) die("snapshot: a symlink target too long", 0, 1);
        header(path, plen, '2', mode, 0, st_mtime(&st), target, (size_t)n);
        break;
    }
    case S_IFIFO:
        header(path, plen, '6', mode, 0, st_mtime(&st), 0, 0);
        break;
    case S_IFCHR:
        header(path, plen, '3', mode, 0, st_mtime(&st), 0, 0);
        break;
    case S_IFBLK:
        header(path, plen, '4', mode, 0, st_mtime(&st), 0, 0);
        break;
    default: /* sockets: the engine's archive leaves them out too */
        break;
    }
}

/* Lists directory `dfd` into the arena, then writes its entries (`.gitignore` first) and
 * what is under them; `path` holds the directory's tar name with its '/' (length plen). */
static void walk_dir(int dfd, size_t plen, int stable) {
    size_t start = arena_used;
    for (;;) {
        long n = sys6(SYS_getdents64, dfd, (long)dents, sizeof dents, 0, 0, 0);
        if (n == -4) continue;
        if (n < 0) die("snapshot: listing a directory", n, 1);
        if (n == 0) break;
        for (long off = 0; off < n;) {
            u16 reclen = *(u16 *)(dents + off + 16);
            const char *nm = (const char *)(dents + off + 19);
            off += reclen;
            if (streq(nm, ".") || streq(nm, "..")) continue;
            if (plen == root_plen && streq(nm, ".git")) continue;
            size_t len = slen(nm) + 1;
            if (arena_used + len > sizeof arena) die("snapshot: too many names", 0, 1);
            memcpy(arena + arena_used, nm, len);
            arena_used += len;
        }
    }
    size_t end = arena_used;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t at = start; at < end;) {
            const char *nm = arena + at;
            size_t len = slen(nm);
            at += len + 1;
            if (is_gitignore(nm) != (pass == 0)) continue;
            if (plen + len > PATH_MAX_) die("snapshot: a path too long", 0, 1);
            memcpy(path + plen, nm, len);
            path[plen + len] = 0;
            entry(dfd, nm, plen + len, stable);
        }
    }
    arena_used = start;
}

static void snapshot(const char *marker, const char *root) {
    struct kstat st;
    long r = sys6(SYS_newfstatat, AT_FDCWD, (long)marker, (long)&st, 0x100, 0, 0);
    if (r < 0) die("snapshot: reading the marker", r, 1);
    since_sec = st_ctime(&st), since_nsec = st_ctime_ns(&st);
    long fd = sys6(SYS_openat, AT_FDCWD, (long)root, O_RDONLY | O_CLOEXEC | O_DIRECTORY, 0, 0, 0);
    if (fd < 0) die("snapshot: opening the root", fd, 1);
    r = sys6(SYS_newfstatat, fd, (long)"", (long)&st, 0x1000 /* AT_EMPTY_PATH */, 0, 0);
    if (r < 0) die("snapshot: reading the root's metadata", r, 1);
    /* The root's own name: its last component. */
    size_t n = slen(root);
    while (n > 1 && root[n - 1] == '/') n--;
    size_t b = n;
    while (b > 0 && root[b - 1] != '/') b--;
    if (n - b == 0 || n - b > 255) die("snapshot: bad root", 0, 2);
    memcpy(path, root + b, n - b);
    path[n - b] = '/';
    header(path, n - b + 1, '5', st_mode(&st), 0, st_mtime(&st), 0, 0);
    root_plen = n - b + 1;
    walk_dir((int)fd, root_plen, 1);
    static const u8 zero[1024];
    tar_put(zero, sizeof zero);
    tar_flush();
    sys6(SYS_exit_group, 0, 0, 0, 0, 0, 0);
}

#include "kodx-checks.c"

void cmain(long *sp) {
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    static const char usage[] =
        "usage: kodx-net hold | hold-idle SECS | gate | checks | snapshot[-on-line] MARKER ROOT | addrs | "
        "routes SPEC... | "
        "fence PID SPEC... | plug PID BRIDGE NET/PREFIX GATEWAY FIRST COUNT DNS SPEC... | "
        "unplug PID [SPEC...] | unroute PID SPEC... | "
        "narrow PID|- GATEWAY PORT ROUTE... | probe ADDR PORT";
    if (argc < 2) die(usage, 0, 2);
    if (streq(argv[1], "hold")) {
        /* A signal whose default is to end the process (the engine's stop) ends it. */
        for (;;) sys6(SYS_ppoll, 0, 0, 0, 0, 8, 0);
    }
    if (streq(argv[1], "gate")) {
        if (argc != 2) die(usage, 0, 2);
        gate(argv + argc + 1);
    }
    if (streq(argv[1], "checks")) {
        if (argc != 2) die(usage, 0, 2);
        checks(argv + argc + 1);
    }
    if (streq(argv[1], "snapshot") || streq(argv[1], "snapshot-on-line")) {
        if (argc != 4) die(usage, 0, 2);
        /* Its stdout is the change set kodx commits and checks: nothing in the sandbox may
         * open it through /proc (the sandbox has no CAP_SYS_PTRACE), as for the checks. */
        if (sys6(SYS_prctl, PR_SET_DUMPABLE, 0, 0, 0, 0, 0) < 0) die("snapshot: becoming non-dumpable", 0, 1);
        if (streq(argv[1], "snapshot-on-line")) {
            char c = 0;
            for (int n = 0; c != '\n'; n++) {
                long r = sys6(SYS_read, 0, (long)&c, 1, 0, 0, 0);
                if (r == -4) continue;
                if (r <= 0 || n > 64) sys6(SYS_exit_group, 3, 0, 0, 0, 0, 0);
            }
        }
        snapshot(argv[2], argv[3]);
    }
    if (streq(argv[1], "probe")) {
        if (argc != 4) die(usage, 0, 2);
        probe(argv[2], argv[3]);
    }
    if (streq(argv[1], "hold-idle")) {
        if (argc != 3) die(usage, 0, 2);
        hold_idle(parse_dec(argv[2]));
    }
    long first = 2, rootfd = -1;
    if (streq(argv[1], "fence")) {
        if (argc < 3) die(usage, 0, 2);
        /* Before the netlink socket: a socket belongs to the namespace it was made in. */
        enter_netns(argv[2]);
        first = 3;
    } else if (streq(argv[1], "plug")) {
        if (argc < 9) die(usage, 0, 2);
        rootfd = open_proc(argv[2], "root", O_PATH | O_DIRECTORY);
        plug(argc, argv);
        first = 9;
    } else if (streq(argv[1], "unplug") || streq(argv[1], "unroute")) {
        if (argc < 3) die(usage, 0, 2);
        unplug(argv[2], argv + 3, argc - 3, streq(argv[1], "unplug"));
        first = argc;
    } else if (streq(argv[1], "narrow")) {
        if (argc < 5) die(usage, 0, 2);
        narrow(argc, argv);
        first = argc;
    } else if (!streq(argv[1], "routes") && !streq(argv[1], "addrs")) {
        die(usage, 0, 2);
    }
    int fd = nl_open();
    if (!streq(argv[1], "addrs")) {
        for (long i = first; i < argc; i++)
            if (argv[i][0] == 'u' || argv[i][0] == 'g') add_route(fd, argv[i]);
    }
    /* A sandbox that joined through the engine: its output filter now (`plug` wrote it
     * before the interface came up). */
    for (long i = first; rootfd < 0 && i < argc; i++) {
        u8 a[4];
        const char *p = argv[i][0] == 'n' ? parse_addr(argv[i] + 1, a) : 0;
        if (!p || *p != '/') continue;
        long prefix = parse_dec(p + 1);
        if (prefix < 8 || prefix > 30) die("bad subnet prefix", 0, 2);
        u32 net = (u32)a[0] << 24 | (u32)a[1] << 16 | (u32)a[2] << 8 | a[3];
        sandbox_filter(net, ~0u << (32 - prefix), argv + first, argc - first);
    }
    if (rootfd >= 0) {
        block_host(fd, argv + first, argc - first);
        u8 gw[4];
        parse_addr(argv[5], gw);
        block_peers(fd, argv + first, argc - first, (u32)gw[0] << 24 | (u32)gw[1] << 16 | (u32)gw[2] << 8 | gw[3]);
    }
    if (rootfd >= 0) fix_resolvers(rootfd, streq(argv[8], "-") ? "" : argv[8]);
    dump_addrs(fd);
    flush(1);
    sys6(SYS_exit_group, 0, 0, 0, 0, 0, 0);
    for (;;) {
    }
}
