/*
 * The MPS emulator's nvidia-cuda-mps-control (dra_driver.mpsemu), compiled: not NVIDIA's program.
 *
 * The driver runs the control program once per MPS command. NVIDIA's is compiled and starts in
 * about a millisecond; a Python client needs tens of milliseconds before its first byte, so a
 * benchmark of the driver through a Python client measures the emulator. This program is the
 * client path only: a plain command ("server list", "namespace create x --server=y", ...) goes
 * to the control daemon at $CUDA_MPS_PIPE_DIRECTORY/control (default /tmp/nvidia-mps) and its
 * answer is printed, with its exit status. Everything else (no command, options such as -d, -f,
 * -q, -h, or "<module> help") is handed to the Python program beside this one,
 * nvidia-cuda-mps-control-py (dra_driver/mpsemu/cli.py), which is the reference for every answer.
 *
 * Wire (dra_driver/mpsemu/wire.py): one request line {"args": ["server", "list"]}; the reply is
 * "<rc> <stdout bytes> <stderr bytes>\n" then stdout and stderr; the daemon closes after it.
 * Each step waits at most CLIENT_TIMEOUT_S, as the Python client does.
 *
 * Built by dra_driver/mpsemu/paths.py (emulator_path) with the system's C compiler, statically.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define CLIENT_TIMEOUT_S 30
#define MAX_REQUEST (64 * 1024)
#define MAX_REPLY (8 * 1024 * 1024)
#define HEADER_LIMIT 64
#define NO_DAEMON "Cannot find MPS control daemon process"
#define DEFAULT_PIPE "/tmp/nvidia-mps"
#define PYTHON_PROGRAM "nvidia-cuda-mps-control-py"

/* The answer printed as the Python program prints it: stdout as is, stderr with one newline. */
static int emit(int rc, const char *out, size_t n_out, const char *err, size_t n_err) {
    if (n_out > 0)
        fwrite(out, 1, n_out, stdout);
    fflush(stdout);
    while (n_err > 0 && err[n_err - 1] == '\n')
        n_err--;
    if (n_err > 0) {
        fwrite(err, 1, n_err, stderr);
        fputc('\n', stderr);
    }
    fflush(stderr);
    return rc;
}

static int fail(const char *message) { return emit(1, "", 0, message, strlen(message)); }

/* This program's own path, links resolved: from argv[0] when it names a path (as when run by
 * its full path; /proc may not be mounted, e.g. under a bare chroot), else /proc/self/exe. */
static int own_path(const char *argv0, char self[PATH_MAX]) {
    if (strchr(argv0, '/') != NULL && realpath(argv0, self) != NULL)
        return 0;
    ssize_t n = readlink("/proc/self/exe", self, PATH_MAX - 1);
    if (n <= 0)
        return -1;
    self[n] = '\0';
    return 0;
}

/* Run the Python program with the same arguments (it answers everything but plain commands). */
static int hand_to_python(char **argv) {
    char self[PATH_MAX], program[PATH_MAX];
    if (own_path(argv[0], self) != 0)
        return fail("nvidia-cuda-mps-control (emulator): cannot find its own path");
    char *slash = strrchr(self, '/');
    *slash = '\0';
    if (snprintf(program, sizeof program, "%s/%s", self, PYTHON_PROGRAM) >= (int)sizeof program)
        return fail("nvidia-cuda-mps-control (emulator): path too long");
    argv[0] = program;
    execv(program, argv);
    char message[PATH_MAX + 128];
    snprintf(message, sizeof message, "nvidia-cuda-mps-control (emulator): cannot run %s: %s",
             program, strerror(errno));
    return fail(message);
}

/* Whether the arguments are a plain command this program sends itself. */
static int plain_command(int argc, char **argv) {
    if (argc < 2 || argv[1][0] == '-')
        return 0;
    return !(argc >= 3 && (strcmp(argv[2], "help") == 0 || strcmp(argv[2], "--help") == 0));
}

/* The request line {"args": [...]}: '"', '\' and control characters escaped; -1 if too long. */
static ssize_t encode_request(int argc, char **argv, char *buf, size_t size) {
    size_t len = 0;
#define PUT(c)                                                                                     \
    do {                                                                                           \
        if (len + 1 >= size)                                                                       \
            return -1;                                                                             \
        buf[len++] = (char)(c);                                                                    \
    } while (0)
    const char *head = "{\"args\": [";
    for (const char *p = head; *p; p++)
        PUT(*p);
    for (int i = 1; i < argc; i++) {
        if (i > 1) {
            PUT(',');
            PUT(' ');
        }
        PUT('"');
        for (const unsigned char *p = (const unsigned char *)argv[i]; *p; p++) {
            if (*p == '"' || *p == '\\') {
                PUT('\\');
                PUT(*p);
            } else if (*p < 0x20) {
                char esc[7];
                snprintf(esc, sizeof esc, "\\u%04x", *p);
                for (const char *e = esc; *e; e++)
                    PUT(*e);
            } else {
                PUT(*p);
            }
        }
        PUT('"');
    }
    PUT(']');
    PUT('}');
    PUT('\n');
#undef PUT
    return (ssize_t)len;
}

static int send_all(int fd, const char *buf, size_t len) {
    while (len > 0) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return -1;
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static int no_answer(const char *why) {
    char message[256];
    snprintf(message, sizeof message, "no answer from the MPS control daemon: %s", why);
    return fail(message);
}

int main(int argc, char **argv) {
    if (!plain_command(argc, argv))
        return hand_to_python(argv);
    const char *pipe_dir = getenv("CUDA_MPS_PIPE_DIRECTORY");
    if (pipe_dir == NULL)
        pipe_dir = DEFAULT_PIPE;
    static char request[MAX_REQUEST + 2];
    ssize_t request_len = encode_request(argc, argv, request, sizeof request);
    if (request_len < 0)
        return fail("nvidia-cuda-mps-control (emulator): command longer than the request limit");

    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (snprintf(addr.sun_path, sizeof addr.sun_path, "%s/control", pipe_dir) >=
        (int)sizeof addr.sun_path)
        return fail(NO_DAEMON " (AF_UNIX path too long)");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return fail(NO_DAEMON);
    struct timeval timeout = {.tv_sec = CLIENT_TIMEOUT_S};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        if (errno == ENOENT || errno == ECONNREFUSED || errno == ENOTDIR)
            return fail(NO_DAEMON);
        char message[256];
        snprintf(message, sizeof message, NO_DAEMON " (%s)", strerror(errno));
        return fail(message);
    }
    if (send_all(fd, request, (size_t)request_len) != 0)
        return no_answer(strerror(errno));

    /* the header line, then as many bytes as it gives; what the daemon does after them (it
     * closes, perhaps with a reset when it did not read the request) is not waited for */
    size_t cap = 65536, len = 0, need = 0, header = 0;
    long rc = 0;
    unsigned long n_out = 0, n_err = 0;
    char *reply = malloc(cap);
    if (reply == NULL)
        return fail("nvidia-cuda-mps-control (emulator): out of memory");
    while (need == 0 || len < need) {
        if (len == cap) {
            cap *= 2;
            char *bigger = realloc(reply, cap);
            if (bigger == NULL)
                return fail("nvidia-cuda-mps-control (emulator): out of memory");
            reply = bigger;
        }
        ssize_t n = recv(fd, reply + len, need ? (need - len < cap - len ? need - len : cap - len)
                                              : cap - len, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return no_answer("no complete reply within 30 s");
        if (n < 0)
            return no_answer(strerror(errno));
        if (n == 0)
            break;
        len += (size_t)n;
        if (need == 0) {
            char *newline = memchr(reply, '\n', len < HEADER_LIMIT + 1 ? len : HEADER_LIMIT + 1);
            if (newline == NULL) {
                if (len > HEADER_LIMIT)
                    return no_answer("reply header longer than the limit");
                continue;
            }
            *newline = '\0';
            int used = 0;
            if (reply[0] == ' ' || reply[0] == '+' ||
                sscanf(reply, "%ld %lu %lu%n", &rc, &n_out, &n_err, &used) != 3 ||
                reply + used != newline || strchr(reply, '+') != NULL || strstr(reply, "  "))
                return no_answer("reply header is not '<rc> <stdout bytes> <stderr bytes>'");
            if (n_out > MAX_REPLY || n_err > MAX_REPLY || n_out + n_err > MAX_REPLY)
                return no_answer("reply longer than the limit");
            header = (size_t)(newline + 1 - reply);
            need = header + n_out + n_err;
            if (need == header)
                break;
        }
    }
    close(fd);
    if (need == 0 || len != need)
        return no_answer("reply is not as long as its header says");
    const char *out = reply + header;
    return emit((int)rc, out, n_out, out + n_out, n_err);
}
