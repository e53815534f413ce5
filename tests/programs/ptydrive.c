/*
 * ptydrive: runs a command on a new pseudo-terminal and types into it
 * from a script, the way a person at a terminal would (what tmux or
 * expect do, small enough to build static for the AMD-V test machine).
 *
 *   ptydrive SCRIPT COMMAND [ARG]...
 *
 * SCRIPT lines, in order:
 *   wait TEXT     wait until the terminal has printed TEXT (after the
 *                 previous match); gives up after 600 s (exit status 3)
 *   send TEXT     type TEXT
 *   sleep MS      let MS milliseconds pass
 * TEXT escapes: \r, \n, \a (Ctrl-A, the vtrace console's escape), \\.
 * Everything the terminal prints is copied to standard output. The exit
 * status is the command's.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char seen[1 << 20];
static size_t seen_len, matched;
static int master = -1, done;

static long now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Copies what the terminal prints for up to `ms` milliseconds. */
static void pump(long ms)
{
    long end = now_ms() + ms;
    for (long left = ms; left >= 0 && !done; left = end - now_ms()) {
        struct pollfd p = { .fd = master, .events = POLLIN };
        if (poll(&p, 1, (int)left) <= 0)
            continue;
        char buf[4096];
        ssize_t n = read(master, buf, sizeof buf);
        if (n <= 0) { /* EIO: the command closed the terminal */
            done = 1;
            break;
        }
        fwrite(buf, 1, (size_t)n, stdout);
        fflush(stdout);
        if (seen_len + (size_t)n > sizeof seen) { /* keep the newest half */
            size_t keep = sizeof seen / 2;
            size_t drop = seen_len - keep;
            memmove(seen, seen + drop, keep);
            seen_len = keep;
            matched = matched > drop ? matched - drop : 0;
        }
        memcpy(seen + seen_len, buf, (size_t)n);
        seen_len += (size_t)n;
    }
}

static size_t unescape(const char *in, char *out)
{
    size_t n = 0;
    for (; *in && *in != '\n'; in++) {
        if (*in != '\\' || !in[1]) {
            out[n++] = *in;
            continue;
        }
        switch (*++in) {
        case 'r': out[n++] = '\r'; break;
        case 'n': out[n++] = '\n'; break;
        case 'a': out[n++] = 1; break;
        default: out[n++] = *in;
        }
    }
    return n;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: ptydrive SCRIPT COMMAND [ARG]...\n");
        return 2;
    }
    FILE *script = fopen(argv[1], "r");
    if (!script) {
        perror(argv[1]);
        return 2;
    }
    master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) || unlockpt(master)) {
        perror("pseudo-terminal");
        return 2;
    }
    const char *slave = ptsname(master);
    pid_t child = fork();
    if (child == 0) {
        setsid();
        int s = open(slave, O_RDWR);
        if (s < 0 || ioctl(s, TIOCSCTTY, 0) < 0) {
            perror(slave);
            _exit(2);
        }
        struct winsize w = { .ws_row = 24, .ws_col = 80 };
        ioctl(s, TIOCSWINSZ, &w);
        dup2(s, 0), dup2(s, 1), dup2(s, 2);
        execvp(argv[2], argv + 2);
        perror(argv[2]);
        _exit(127);
    }
    char line[4096], text[4096];
    while (fgets(line, sizeof line, script)) {
        if (!strncmp(line, "wait ", 5)) {
            size_t n = unescape(line + 5, text);
            long end = now_ms() + 600000;
            char *at;
            while (!(at = memmem(seen + matched, seen_len - matched, text, n))) {
                if (done || now_ms() > end) {
                    fprintf(stderr, "\nptydrive: never saw \"%.*s\"\n", (int)n, text);
                    kill(child, SIGKILL);
                    return 3;
                }
                pump(200);
            }
            matched = (size_t)(at - seen) + n;
        } else if (!strncmp(line, "send ", 5)) {
            size_t n = unescape(line + 5, text);
            if (write(master, text, n) != (ssize_t)n)
                perror("send");
        } else if (!strncmp(line, "sleep ", 6)) {
            pump(atol(line + 6));
        }
    }
    int status = 0;
    while (waitpid(child, &status, WNOHANG) == 0)
        pump(200);
    pump(0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}
