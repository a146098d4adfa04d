/*
 * shoalgen: the C load generator of `python -m perf` (perf/cgen.py builds and drives it).
 *
 * Theory of operation
 * -------------------
 * One process is one AMQP connection on 127.0.0.1 (no other host can be named), channel 1,
 * PLAIN guest/guest, heartbeat 0, set up with rabbitmq-c (librabbitmq). Two modes:
 *
 *   shoalgen publish --port P [--exchange X] [--routing-key K] [--body-size 128] [--id 0]
 *                    --count N --seconds S [--rate R] [--batch 256] [--grace 20]
 *   shoalgen consume --port P --queue Q[,Q2...] [--prefetch 10] [--global 0] [--ack-every 1]
 *                    [--ack-rate R]
 *                    --seconds S [--publishers 1] [--capacity N] [--name c0] [--grace 20]
 *   shoalgen buckets V...        (prints the latency bucket of each value: for the tests)
 *
 * A **publisher** never waits for the broker: no confirms, no window. After the handshake it
 * takes the socket over from rabbitmq-c (non-blocking) and writes pre-encoded
 * Basic.Publish + content header + body frames, `--batch` messages per send (about 64 KiB),
 * patching only the sequence number and the CLOCK_MONOTONIC send time into each body; so the
 * only thing that slows it down is TCP (the broker not reading). With `--rate R` it sends one
 * message at a time at R msg/s instead. It reads whatever the broker sends meanwhile
 * (Connection.Close / Channel.Close end the run; Connection.Blocked is counted). It stops
 * after `--count` messages or `--seconds`, whichever is first, finishes the batch in hand
 * (so no frame is cut), sends Connection.Close and waits for Close-Ok (at most `--grace` s).
 *
 * A **consumer** is plain rabbitmq-c, as an application would write it: basic.qos(prefetch),
 * basic.consume (manual acks), amqp_consume_message in a loop, and basic.ack per delivery
 * (multiple=false), or multiple=true every `--ack-every` deliveries; with `--ack-rate R` it
 * takes 1/R s over each delivery before its ack (a slow application). It stops at `--seconds`.
 * Several queues (`--queue a,b,c`) are consumed on its one channel, a consumer each (tags
 * NAME.0, NAME.1, ...), as a celery worker does; `--global 1` makes the prefetch the channel's,
 * shared by those consumers (basic.qos global=true, what celery asks of RabbitMQ).
 *
 * Bodies start with the same 20 bytes as perf/wire.py's PAYLOAD (little-endian):
 *     <H magic 0x5348> <H publisher> <Q sequence> <Q CLOCK_MONOTONIC ns at send>
 * so a consumer's latency is its CLOCK_MONOTONIC at receipt minus that time (one clock for
 * the whole host), kept as a log-linear histogram (32 buckets per power of two, exact below
 * 64 us; perf/cgen.py has the same bucket function and merges the histograms).
 *
 * Control: the process prints {"event":"ready"} on stdout when set up, then waits (60 s at
 * most) for a line "go" on stdin; "stop" (or stdin closing) ends the run early. While it
 * runs it prints {"event":"progress",...} once a second, and at the end one
 * {"event":"result",...} line. Every wait is bounded, and alarm() kills the process if
 * everything else failed: ready wait + seconds + 2 x grace + 30 s.
 */

#define _GNU_SOURCE
#include <amqp.h>
#include <amqp_tcp_socket.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HOST "127.0.0.1"
#define MAGIC 0x5348
#define PAYLOAD_SIZE 20
#define HIST_SIZE 2048
#define READY_WAIT_S 60.0
#define SEND_CHUNK 65536
#define CLIENT_FRAME_MAX 131072
#define INBUF_SIZE (1 << 20)

/* ------------------------------------------------------------------------- small helpers */

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static double cpu_seconds(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return (double)u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + (double)u.ru_stime.tv_sec +
         u.ru_stime.tv_usec / 1e6;
}

static void put_u16(uint8_t *p, unsigned v) {
  p[0] = (uint8_t)(v >> 8);
  p[1] = (uint8_t)v;
}

static void put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

static void put_u64(uint8_t *p, uint64_t v) {
  for (int i = 7; i >= 0; i--) {
    p[i] = (uint8_t)v;
    v >>= 8;
  }
}

static void put_le64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) {
    p[i] = (uint8_t)v;
    v >>= 8;
  }
}

static uint64_t get_le(const uint8_t *p, int n) {
  uint64_t v = 0;
  for (int i = n - 1; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

static unsigned get_u16(const uint8_t *p) { return ((unsigned)p[0] << 8) | p[1]; }

static uint32_t get_u32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | p[3];
}

/* A JSON string literal of s (quotes included) into out. */
static void json_str(char *out, size_t cap, const char *s) {
  size_t o = 0;
  if (cap < 3) return;
  out[o++] = '"';
  for (; s && *s && o + 8 < cap; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') {
      out[o++] = '\\';
      out[o++] = (char)c;
    } else if (c < 0x20) {
      o += (size_t)snprintf(out + o, cap - o, "\\u%04x", c);
    } else {
      out[o++] = (char)c;
    }
  }
  out[o++] = '"';
  out[o] = 0;
}

static char error_text[512];

static void set_error(const char *fmt, ...) {
  if (error_text[0]) return; /* the first error is the cause */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(error_text, sizeof error_text, fmt, ap);
  va_end(ap);
}

static void error_json(char *out, size_t cap) {
  if (error_text[0])
    json_str(out, cap, error_text);
  else
    snprintf(out, cap, "null");
}

/* ------------------------------------------------------------------------- stdin control */

static int go_seen, stop_seen;
static char ctl_buf[256];
static size_t ctl_len;

/* Read what stdin has (waiting at most timeout_ms); note "go", "stop" and EOF. */
static void ctl_check(int timeout_ms) {
  struct pollfd pf = {0, POLLIN, 0};
  if (stop_seen) return;
  if (poll(&pf, 1, timeout_ms) <= 0) return;
  if (!(pf.revents & (POLLIN | POLLHUP | POLLERR))) return;
  ssize_t n = read(0, ctl_buf + ctl_len, sizeof ctl_buf - 1 - ctl_len);
  if (n <= 0) {
    stop_seen = 1; /* the orchestrator is gone (or closed stdin): stop */
    return;
  }
  ctl_len += (size_t)n;
  ctl_buf[ctl_len] = 0;
  if (strstr(ctl_buf, "stop")) stop_seen = 1;
  if (strstr(ctl_buf, "go")) go_seen = 1;
  if (ctl_len > sizeof ctl_buf / 2) { /* keep the unfinished last line only */
    char *nl = strrchr(ctl_buf, '\n');
    size_t keep = nl ? ctl_len - (size_t)(nl + 1 - ctl_buf) : 0;
    memmove(ctl_buf, ctl_buf + ctl_len - keep, keep);
    ctl_len = keep;
    ctl_buf[ctl_len] = 0;
  }
}

static int wait_go(void) {
  double limit = mono() + READY_WAIT_S;
  while (!go_seen && !stop_seen && mono() < limit) ctl_check(100);
  return go_seen && !stop_seen;
}

/* ------------------------------------------------------------------------- histogram */

/* Exact below 64 us; above, 32 buckets per power of two (at most ~3 % wide). */
static int bucket_of(uint64_t v) {
  if (v < 64) return (int)v;
  int bits = 64 - __builtin_clzll(v);
  int shift = bits - 6;
  return 64 + (bits - 7) * 32 + (int)((v >> shift) - 32);
}

static uint64_t hist[HIST_SIZE];
static uint64_t hist_max;

static void hist_add(int64_t us) {
  uint64_t v = us < 0 ? 0 : (uint64_t)us;
  hist[bucket_of(v)]++;
  if (v > hist_max) hist_max = v;
}

static void hist_print(void) {
  int first = 1;
  printf("[");
  for (int i = 0; i < HIST_SIZE; i++) {
    if (!hist[i]) continue;
    printf("%s[%d,%" PRIu64 "]", first ? "" : ",", i, hist[i]);
    first = 0;
  }
  printf("]");
}

/* ------------------------------------------------------------------------- options */

struct opts {
  const char *mode;
  int port;
  const char *exchange;
  const char *routing_key;
  const char *queue;
  const char *name;
  int body_size;
  int id;
  long long count;
  double seconds;
  double rate;
  int batch;
  double grace;
  int prefetch;
  int global;
  int ack_every;
  double ack_rate;
  int publishers;
  long long capacity;
};

static int parse_opts(int argc, char **argv, struct opts *o) {
  memset(o, 0, sizeof *o);
  o->mode = argv[1];
  o->exchange = "";
  o->routing_key = "";
  o->queue = "";
  o->name = "c";
  o->body_size = 128;
  o->count = 1000000;
  o->seconds = 10.0;
  o->batch = 256;
  o->grace = 20.0;
  o->prefetch = 10;
  o->ack_every = 1;
  o->publishers = 1;
  o->capacity = 0;
  for (int i = 2; i < argc; i += 2) {
    const char *k = argv[i];
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!v) {
      fprintf(stderr, "shoalgen: %s needs a value\n", k);
      return -1;
    }
    if (!strcmp(k, "--port")) o->port = atoi(v);
    else if (!strcmp(k, "--exchange")) o->exchange = v;
    else if (!strcmp(k, "--routing-key")) o->routing_key = v;
    else if (!strcmp(k, "--queue")) o->queue = v;
    else if (!strcmp(k, "--name")) o->name = v;
    else if (!strcmp(k, "--body-size")) o->body_size = atoi(v);
    else if (!strcmp(k, "--id")) o->id = atoi(v);
    else if (!strcmp(k, "--count")) o->count = atoll(v);
    else if (!strcmp(k, "--seconds")) o->seconds = atof(v);
    else if (!strcmp(k, "--rate")) o->rate = atof(v);
    else if (!strcmp(k, "--batch")) o->batch = atoi(v);
    else if (!strcmp(k, "--grace")) o->grace = atof(v);
    else if (!strcmp(k, "--prefetch")) o->prefetch = atoi(v);
    else if (!strcmp(k, "--global")) o->global = atoi(v) != 0;
    else if (!strcmp(k, "--ack-every")) o->ack_every = atoi(v);
    else if (!strcmp(k, "--ack-rate")) o->ack_rate = atof(v);
    else if (!strcmp(k, "--publishers")) o->publishers = atoi(v);
    else if (!strcmp(k, "--capacity")) o->capacity = atoll(v);
    else {
      fprintf(stderr, "shoalgen: unknown option %s\n", k);
      return -1;
    }
  }
  if (o->port <= 0 || o->port > 65535) return fprintf(stderr, "shoalgen: --port\n"), -1;
  if (o->seconds <= 0 || o->seconds > 3600) return fprintf(stderr, "shoalgen: --seconds\n"), -1;
  if (o->count < 0 || o->grace < 0 || o->grace > 600) return fprintf(stderr, "shoalgen: --count/--grace\n"), -1;
  if (o->body_size < PAYLOAD_SIZE || o->body_size > (64 << 20))
    return fprintf(stderr, "shoalgen: --body-size\n"), -1;
  if (o->batch < 1) o->batch = 1;
  if (o->ack_every < 1) o->ack_every = 1;
  if (o->prefetch < 0 || o->prefetch > 65535) return fprintf(stderr, "shoalgen: --prefetch\n"), -1;
  if (o->publishers < 1 || o->publishers > 1024) return fprintf(stderr, "shoalgen: --publishers\n"), -1;
  if (o->capacity < 0 || o->capacity > (1LL << 33)) return fprintf(stderr, "shoalgen: --capacity\n"), -1;
  if (o->id < 0 || o->id > 65535) return fprintf(stderr, "shoalgen: --id\n"), -1;
  return 0;
}

/* ------------------------------------------------------------------------- connection setup */

static void describe_reply(amqp_rpc_reply_t r, const char *what) {
  switch (r.reply_type) {
    case AMQP_RESPONSE_NORMAL:
      return;
    case AMQP_RESPONSE_NONE:
      set_error("%s: no reply", what);
      return;
    case AMQP_RESPONSE_LIBRARY_EXCEPTION:
      set_error("%s: %s", what, amqp_error_string2(r.library_error));
      return;
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (r.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        amqp_connection_close_t *m = (amqp_connection_close_t *)r.reply.decoded;
        set_error("%s: Connection.Close %u %.*s", what, m->reply_code, (int)m->reply_text.len,
                  (char *)m->reply_text.bytes);
      } else if (r.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        amqp_channel_close_t *m = (amqp_channel_close_t *)r.reply.decoded;
        set_error("%s: Channel.Close %u %.*s", what, m->reply_code, (int)m->reply_text.len,
                  (char *)m->reply_text.bytes);
      } else {
        set_error("%s: server exception, method 0x%08x", what, r.reply.id);
      }
      return;
  }
}

static amqp_connection_state_t open_channel(const struct opts *o) {
  amqp_connection_state_t conn = amqp_new_connection();
  amqp_socket_t *sock = amqp_tcp_socket_new(conn);
  struct timeval tv = {10, 0};
  if (!sock) {
    set_error("amqp_tcp_socket_new failed");
    amqp_destroy_connection(conn);
    return NULL;
  }
  int rc = amqp_socket_open_noblock(sock, HOST, o->port, &tv);
  if (rc != AMQP_STATUS_OK) {
    set_error("connect 127.0.0.1:%d: %s", o->port, amqp_error_string2(rc));
    amqp_destroy_connection(conn);
    return NULL;
  }
  amqp_set_handshake_timeout(conn, &tv);
  amqp_set_rpc_timeout(conn, &tv);
  amqp_rpc_reply_t r =
      amqp_login(conn, "/", 0, CLIENT_FRAME_MAX, 0, AMQP_SASL_METHOD_PLAIN, "guest", "guest");
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    describe_reply(r, "login");
    amqp_destroy_connection(conn);
    return NULL;
  }
  amqp_channel_open(conn, 1);
  r = amqp_get_rpc_reply(conn);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    describe_reply(r, "channel.open");
    amqp_destroy_connection(conn);
    return NULL;
  }
  return conn;
}

static void print_ready(const char *role) {
  printf("{\"event\":\"ready\",\"role\":\"%s\",\"pid\":%d}\n", role, (int)getpid());
  fflush(stdout);
}

static void print_progress(long long count, double t) {
  printf("{\"event\":\"progress\",\"count\":%lld,\"t\":%.3f}\n", count, t);
  fflush(stdout);
}

/* ------------------------------------------------------------------------- publisher */

struct pub {
  int fd;
  uint8_t *in;
  size_t in_len;
  int broker_closed;  /* Connection.Close received */
  int channel_closed; /* Channel.Close received */
  int close_ok;       /* Connection.Close-Ok received */
  long long blocked;  /* Connection.Blocked received */
  double tcp_wait_s;  /* time spent waiting for the socket to take more */
};

/* Parse complete frames in p->in: the broker closing things, Connection.Blocked, Close-Ok. */
static void parse_incoming(struct pub *p) {
  size_t pos = 0;
  while (p->in_len - pos >= 7) {
    uint8_t *f = p->in + pos;
    uint32_t size = get_u32(f + 3);
    if ((size_t)size + 8 > INBUF_SIZE) {
      set_error("frame of %u bytes from the broker", size);
      p->broker_closed = 1;
      return;
    }
    if (p->in_len - pos < (size_t)size + 8) break;
    if (f[0] == 1 && size >= 4) {
      unsigned cls = get_u16(f + 7), meth = get_u16(f + 9);
      if ((cls == 10 && meth == 50) || (cls == 20 && meth == 40)) {
        unsigned code = size >= 7 ? get_u16(f + 11) : 0;
        unsigned len = size >= 7 ? f[13] : 0;
        if (len > size - 7) len = 0;
        set_error("%s %u %.*s", cls == 10 ? "Connection.Close" : "Channel.Close", code, (int)len,
                  (char *)f + 14);
        if (cls == 10) p->broker_closed = 1;
        else p->channel_closed = 1;
      } else if (cls == 10 && meth == 51) {
        p->close_ok = 1;
      } else if (cls == 10 && meth == 60) {
        p->blocked++;
      }
    }
    pos += (size_t)size + 8;
  }
  memmove(p->in, p->in + pos, p->in_len - pos);
  p->in_len -= pos;
}

/* Read what the socket has without blocking; -1 when the broker closed it. */
static int read_incoming(struct pub *p) {
  for (;;) {
    if (p->in_len == INBUF_SIZE) {
      set_error("input buffer full");
      return -1;
    }
    ssize_t n = recv(p->fd, p->in + p->in_len, INBUF_SIZE - p->in_len, MSG_DONTWAIT);
    if (n > 0) {
      p->in_len += (size_t)n;
      parse_incoming(p);
      continue;
    }
    if (n == 0) {
      if (!p->close_ok) set_error("the broker closed the socket");
      p->broker_closed = 1;
      return -1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    if (errno == EINTR) continue;
    set_error("recv: %s", strerror(errno));
    p->broker_closed = 1;
    return -1;
  }
}

/* Write len bytes (stops early only past `hard` or when the broker closed); returns bytes written. */
static size_t write_all(struct pub *p, const uint8_t *data, size_t len, double hard) {
  size_t done = 0;
  while (done < len && !p->broker_closed) {
    ssize_t n = send(p->fd, data + done, len - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      done += (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      set_error("send: %s", strerror(errno));
      p->broker_closed = 1;
      break;
    }
    double waited = mono();
    if (waited > hard) {
      set_error("send blocked past the hard deadline (the broker stopped reading)");
      break;
    }
    struct pollfd pf = {p->fd, POLLOUT | POLLIN, 0};
    poll(&pf, 1, 100);
    p->tcp_wait_s += mono() - waited;
    if (pf.revents & (POLLIN | POLLHUP | POLLERR)) {
      if (read_incoming(p) < 0) break;
    }
  }
  return done;
}

static size_t method_frame(uint8_t *out, unsigned channel, unsigned cls, unsigned meth,
                           const uint8_t *args, size_t args_len) {
  out[0] = 1;
  put_u16(out + 1, channel);
  put_u32(out + 3, (uint32_t)(4 + args_len));
  put_u16(out + 7, cls);
  put_u16(out + 9, meth);
  memcpy(out + 11, args, args_len);
  out[11 + args_len] = 0xCE;
  return 12 + args_len;
}

/* One message's frames; *patch_at = offset of (sequence, timestamp) in the first body frame. */
static uint8_t *publish_template(const struct opts *o, int frame_max, size_t *size, size_t *patch_at) {
  size_t ex = strlen(o->exchange), rk = strlen(o->routing_key);
  size_t chunk = (size_t)frame_max - 8;
  size_t nbody = ((size_t)o->body_size + chunk - 1) / chunk;
  size_t cap = 12 + 2 + 1 + ex + 1 + rk + 1 + 8 + 14 + (size_t)o->body_size + nbody * 8;
  uint8_t *t = calloc(1, cap), args[600], *body = calloc(1, (size_t)o->body_size);
  size_t a = 0, pos;
  if (!t || !body || ex > 255 || rk > 255) {
    free(t);
    free(body);
    return NULL;
  }
  put_u16(args, 0); /* ticket */
  a = 2;
  args[a++] = (uint8_t)ex;
  memcpy(args + a, o->exchange, ex);
  a += ex;
  args[a++] = (uint8_t)rk;
  memcpy(args + a, o->routing_key, rk);
  a += rk;
  args[a++] = 0; /* mandatory, immediate */
  pos = method_frame(t, 1, 60, 40, args, a);
  t[pos] = 2; /* content header: class 60, weight 0, body size, no properties */
  put_u16(t + pos + 1, 1);
  put_u32(t + pos + 3, 14);
  put_u16(t + pos + 7, 60);
  put_u16(t + pos + 9, 0);
  put_u64(t + pos + 11, (uint64_t)o->body_size);
  put_u16(t + pos + 19, 0);
  t[pos + 21] = 0xCE;
  pos += 22;
  body[0] = MAGIC & 0xff;
  body[1] = MAGIC >> 8;
  body[2] = (uint8_t)o->id;
  body[3] = (uint8_t)(o->id >> 8);
  for (int i = PAYLOAD_SIZE; i < o->body_size; i++) body[i] = (uint8_t)(0x61 + i % 26);
  *patch_at = pos + 7 + 4;
  for (size_t start = 0; start < (size_t)o->body_size; start += chunk) {
    size_t n = (size_t)o->body_size - start < chunk ? (size_t)o->body_size - start : chunk;
    t[pos] = 3;
    put_u16(t + pos + 1, 1);
    put_u32(t + pos + 3, (uint32_t)n);
    memcpy(t + pos + 7, body + start, n);
    t[pos + 7 + n] = 0xCE;
    pos += n + 8;
  }
  free(body);
  *size = pos;
  return t;
}

static int run_publish(const struct opts *o) {
  struct pub p;
  memset(&p, 0, sizeof p);
  long long sent = 0;
  double started = 0, finished = 0, cpu0 = 0, cpu = 0, close_s = 0;
  int truncated = 0;
  uint8_t *tmpl = NULL, *buf = NULL;
  size_t msg = 0, patch_at = 0;
  amqp_connection_state_t conn = open_channel(o);
  if (!conn) goto report;
  p.fd = amqp_get_sockfd(conn);
  p.in = malloc(INBUF_SIZE);
  int flags = fcntl(p.fd, F_GETFL);
  fcntl(p.fd, F_SETFL, flags | O_NONBLOCK);
  tmpl = publish_template(o, amqp_get_frame_max(conn), &msg, &patch_at);
  if (!tmpl || !p.in) {
    set_error("out of memory (or exchange/routing key over 255 bytes)");
    goto report;
  }
  int batch = o->rate > 0 ? 1 : o->batch;
  if ((size_t)batch * msg > SEND_CHUNK) batch = (int)(SEND_CHUNK / msg) > 0 ? (int)(SEND_CHUNK / msg) : 1;
  buf = malloc((size_t)batch * msg);
  if (!buf) {
    set_error("out of memory");
    goto report;
  }
  for (int i = 0; i < batch; i++) memcpy(buf + (size_t)i * msg, tmpl, msg);
  print_ready("publisher");
  if (!wait_go()) {
    set_error("no go signal");
    goto report;
  }
  cpu0 = cpu_seconds();
  started = mono();
  double deadline = started + o->seconds, hard = deadline + o->grace;
  double next_progress = started + 0.5, next_ctl = started;
  while (sent < o->count && !stop_seen && !p.broker_closed && !p.channel_closed) {
    double now = mono();
    if (now >= deadline) break;
    if (now >= next_progress) {
      print_progress(sent, now - started);
      next_progress += 0.5;
    }
    if (now >= next_ctl) {
      ctl_check(0);
      read_incoming(&p);
      next_ctl = now + 0.01;
      if (stop_seen || p.broker_closed || p.channel_closed) break;
    }
    if (o->rate > 0) {
      double due = started + (double)sent / o->rate;
      if (due > now) {
        double wait = due - now;
        if (wait > 0.002) { /* sleep on stdin (a "stop" wakes it), up to 1 ms before it is due */
          ctl_check(wait > 0.051 ? 50 : (int)((wait - 0.001) * 1000));
        } else {
          struct timespec ts = {0, (long)(wait * 1e9)};
          nanosleep(&ts, NULL);
        }
        continue;
      }
    }
    long long n = o->count - sent < batch ? o->count - sent : batch;
    uint64_t ts = (uint64_t)mono_ns();
    for (long long i = 0; i < n; i++) {
      put_le64(buf + (size_t)i * msg + patch_at, (uint64_t)(sent + i));
      put_le64(buf + (size_t)i * msg + patch_at + 8, ts);
    }
    size_t len = (size_t)n * msg, done = write_all(&p, buf, len, hard);
    sent += (long long)(done / msg);
    if (done < len) {
      truncated = done % msg != 0;
      break;
    }
  }
  finished = mono();
  cpu = cpu_seconds() - cpu0;
  /* Close: Close-Ok to a broker that closed; else our Connection.Close and wait for Close-Ok
     (it comes after the broker has taken every publish before it). */
  {
    double t = mono(), limit = t + o->grace;
    uint8_t frame[64], args[16];
    size_t len;
    if (p.broker_closed) {
      len = method_frame(frame, 0, 10, 51, args, 0);
      write_all(&p, frame, len, t + 1.0);
    } else if (!truncated) {
      put_u16(args, 200);
      args[2] = 3;
      memcpy(args + 3, "bye", 3);
      put_u16(args + 6, 0);
      put_u16(args + 8, 0);
      len = method_frame(frame, 0, 10, 50, args, 10);
      write_all(&p, frame, len, limit);
      while (!p.close_ok && !p.broker_closed && mono() < limit) {
        struct pollfd pf = {p.fd, POLLIN, 0};
        if (poll(&pf, 1, 100) > 0 && read_incoming(&p) < 0) break;
      }
      if (!p.close_ok) set_error("no Close-Ok within %.0f s of Connection.Close", o->grace);
    }
    close_s = mono() - t;
  }
report:;
  char err[600];
  error_json(err, sizeof err);
  printf("{\"event\":\"result\",\"role\":\"publisher\",\"id\":%d,\"published\":%lld,\"wall_s\":%.6f,"
         "\"cpu_s\":%.6f,\"tcp_wait_s\":%.3f,\"blocked\":%lld,\"close_ok\":%s,\"close_s\":%.3f,"
         "\"started\":%.6f,\"finished\":%.6f,\"error\":%s}\n",
         o->id, sent, started ? finished - started : 0.0, cpu, p.tcp_wait_s, p.blocked,
         p.close_ok ? "true" : "false", close_s, started, finished, err);
  fflush(stdout);
  free(buf);
  free(tmpl);
  free(p.in);
  if (conn) amqp_destroy_connection(conn);
  return error_text[0] ? 1 : 0;
}

/* ------------------------------------------------------------------------- consumer */

static int run_consume(const struct opts *o) {
  long long received = 0, redelivered = 0, duplicates = 0, reordered = 0, foreign = 0, acks = 0;
  long long *highest = calloc((size_t)o->publishers, sizeof(long long));
  long long *by_publisher = calloc((size_t)o->publishers, sizeof(long long));
  uint8_t **seen = calloc((size_t)o->publishers, sizeof(uint8_t *));
  double started = 0, ended = 0, cpu0 = 0, cpu = 0, close_s = 0, first = 0, last = 0;
  int64_t go_ns = 0;
  amqp_connection_state_t conn = NULL;
  if (!highest || !seen || !by_publisher) {
    set_error("out of memory");
    goto report;
  }
  for (int i = 0; i < o->publishers; i++) {
    highest[i] = -1;
    seen[i] = o->capacity ? calloc((size_t)(o->capacity / 8 + 1), 1) : NULL;
    if (o->capacity && !seen[i]) {
      set_error("out of memory");
      goto report;
    }
  }
  conn = open_channel(o);
  if (!conn) goto report;
  amqp_basic_qos(conn, 1, 0, (uint16_t)o->prefetch, (amqp_boolean_t)o->global);
  amqp_rpc_reply_t r = amqp_get_rpc_reply(conn);
  if (r.reply_type != AMQP_RESPONSE_NORMAL) {
    describe_reply(r, "basic.qos");
    goto report;
  }
  {
    int several = strchr(o->queue, ',') != NULL, n = 0;
    const char *q = o->queue;
    for (;;) {
      const char *comma = strchr(q, ',');
      size_t len = comma ? (size_t)(comma - q) : strlen(q);
      char tag[256];
      if (several) snprintf(tag, sizeof tag, "%s.%d", o->name, n);
      else snprintf(tag, sizeof tag, "%s", o->name);
      amqp_bytes_t queue = {len, (void *)q};
      amqp_basic_consume(conn, 1, queue, amqp_cstring_bytes(tag), 0, 0, 0, amqp_empty_table);
      r = amqp_get_rpc_reply(conn);
      if (r.reply_type != AMQP_RESPONSE_NORMAL) {
        describe_reply(r, "basic.consume");
        goto report;
      }
      n++;
      if (!comma) break;
      q = comma + 1;
    }
  }
  print_ready("consumer");
  if (!wait_go()) {
    set_error("no go signal");
    goto report;
  }
  cpu0 = cpu_seconds();
  started = mono();
  go_ns = mono_ns();
  double deadline = started + o->seconds, next_progress = started + 0.5;
  long long pending = 0;
  uint64_t last_tag = 0;
  for (;;) {
    double now = mono();
    if (now >= deadline || stop_seen) break;
    if (now >= next_progress) {
      print_progress(received, now - started);
      next_progress += 0.5;
    }
    double left = deadline - now;
    struct timeval tv = {0, left < 0.05 ? (long)(left * 1e6) : 50000};
    amqp_envelope_t env;
    amqp_maybe_release_buffers(conn);
    r = amqp_consume_message(conn, &env, &tv, 0);
    if (r.reply_type == AMQP_RESPONSE_NORMAL) {
      int64_t at = mono_ns();
      received++;
      last = (double)(at - go_ns) / 1e9;
      if (received == 1) first = last;
      if (env.redelivered) redelivered++;
      const uint8_t *b = env.message.body.bytes;
      if (env.message.body.len >= PAYLOAD_SIZE && get_le(b, 2) == MAGIC) {
        unsigned pub = (unsigned)get_le(b + 2, 2);
        long long seq = (long long)get_le(b + 4, 8);
        hist_add((at - (int64_t)get_le(b + 12, 8)) / 1000);
        if (pub < (unsigned)o->publishers && seq < o->capacity) {
          uint8_t bit = (uint8_t)(1u << (seq & 7));
          if (seen[pub][seq >> 3] & bit) {
            duplicates++;
          } else {
            seen[pub][seq >> 3] |= bit;
            by_publisher[pub]++;
            if (seq < highest[pub]) reordered++;
            else highest[pub] = seq;
          }
        } else if (pub >= (unsigned)o->publishers) {
          foreign++;
        }
      } else {
        foreign++;
      }
      last_tag = env.delivery_tag;
      amqp_destroy_envelope(&env);
      if (o->ack_rate > 0) { /* a slow application: each message takes 1/ack_rate s */
        double due = started + (double)received / o->ack_rate, t = mono();
        if (due > deadline) due = deadline;
        if (due > t) {
          struct timespec ts = {(time_t)(due - t), (long)(((due - t) - (double)(time_t)(due - t)) * 1e9)};
          nanosleep(&ts, NULL);
        }
      }
      if (o->ack_every <= 1) {
        if (amqp_basic_ack(conn, 1, last_tag, 0) != AMQP_STATUS_OK) {
          set_error("basic.ack failed");
          break;
        }
        acks++;
      } else if (++pending >= o->ack_every) {
        if (amqp_basic_ack(conn, 1, last_tag, 1) != AMQP_STATUS_OK) {
          set_error("basic.ack failed");
          break;
        }
        acks++;
        pending = 0;
      }
      if ((received & 255) == 0) ctl_check(0);
      continue;
    }
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION && r.library_error == AMQP_STATUS_TIMEOUT) {
      if (pending) {
        amqp_basic_ack(conn, 1, last_tag, 1);
        acks++;
        pending = 0;
      }
      ctl_check(0);
      continue;
    }
    if (r.reply_type == AMQP_RESPONSE_LIBRARY_EXCEPTION &&
        r.library_error == AMQP_STATUS_UNEXPECTED_STATE) {
      amqp_frame_t frame;
      struct timeval zero = {0, 0};
      if (amqp_simple_wait_frame_noblock(conn, &frame, &zero) == AMQP_STATUS_OK &&
          frame.frame_type == AMQP_FRAME_METHOD) {
        amqp_method_number_t id = frame.payload.method.id;
        if (id == AMQP_CHANNEL_CLOSE_METHOD || id == AMQP_CONNECTION_CLOSE_METHOD) {
          amqp_rpc_reply_t fake = {AMQP_RESPONSE_SERVER_EXCEPTION, frame.payload.method, 0};
          describe_reply(fake, "consuming");
          break;
        }
        if (id == AMQP_BASIC_CANCEL_METHOD) {
          set_error("the broker cancelled the consumer (Basic.Cancel)");
          break;
        }
      }
      continue;
    }
    describe_reply(r, "consuming");
    break;
  }
  if (pending && !error_text[0]) {
    amqp_basic_ack(conn, 1, last_tag, 1);
    acks++;
  }
  ended = mono();
  cpu = cpu_seconds() - cpu0;
  {
    double t = mono();
    struct timeval tv = {(long)(o->grace > 5 ? 5 : o->grace), 0};
    amqp_set_rpc_timeout(conn, &tv);
    if (!error_text[0]) {
      r = amqp_connection_close(conn, AMQP_REPLY_SUCCESS);
      if (r.reply_type != AMQP_RESPONSE_NORMAL) describe_reply(r, "connection.close");
    }
    close_s = mono() - t;
  }
report:;
  char err[600];
  error_json(err, sizeof err);
  printf("{\"event\":\"result\",\"role\":\"consumer\",\"name\":\"%s\",\"received\":%lld,\"acks\":%lld,"
         "\"redelivered\":%lld,\"duplicates\":%lld,\"reordered\":%lld,\"foreign\":%lld,"
         "\"window_s\":%.6f,\"cpu_s\":%.6f,\"first_s\":%.6f,\"last_s\":%.6f,\"close_s\":%.3f,"
         "\"started\":%.6f,\"max_us\":%" PRIu64 ",\"hist\":",
         o->name, received, acks, redelivered, duplicates, reordered, foreign,
         started ? ended - started : 0.0, cpu, first, last, close_s, started, hist_max);
  hist_print();
  printf(",\"by_publisher\":[");
  for (int i = 0; by_publisher && i < o->publishers; i++) printf("%s%lld", i ? "," : "", by_publisher[i]);
  printf("],\"error\":%s}\n", err);
  fflush(stdout);
  if (conn) amqp_destroy_connection(conn);
  for (int i = 0; seen && i < o->publishers; i++) free(seen[i]);
  free(seen);
  free(highest);
  free(by_publisher);
  return error_text[0] ? 1 : 0;
}

/* ------------------------------------------------------------------------- main */

int main(int argc, char **argv) {
  struct opts o;
  signal(SIGPIPE, SIG_IGN);
  if (argc >= 2 && !strcmp(argv[1], "buckets")) {
    for (int i = 2; i < argc; i++) printf("%s%d", i > 2 ? " " : "", bucket_of(strtoull(argv[i], NULL, 10)));
    printf("\n");
    return 0;
  }
  if (argc < 2 || (strcmp(argv[1], "publish") && strcmp(argv[1], "consume"))) {
    fprintf(stderr, "usage: shoalgen publish|consume --port P ... (see the comment at the top of shoalgen.c)\n");
    return 2;
  }
  if (parse_opts(argc, argv, &o) < 0) return 2;
  alarm((unsigned)(READY_WAIT_S + o.seconds + 2 * o.grace + 30));
  return !strcmp(o.mode, "publish") ? run_publish(&o) : run_consume(&o);
}
