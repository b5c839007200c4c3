/* A tiny static test program for real-node tests (no shell in the image).
 *
 *   probe serve LINE...   print each LINE to stdout, then sleep until SIGTERM
 *   probe ls DIR          list DIR's entries, one a line (for kubectl exec)
 *   probe cat FILE        copy FILE to stdout
 *   probe alloc MIB       allocate and touch MIB MiB, then sleep (memory limits)
 *   probe connect IP PORT open a TCP connection, print "connected" (pod networking)
 *   probe listen PORT     accept TCP connections forever, print "accepted <peer>" each
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static volatile sig_atomic_t stop;

static void on_stop(int sig) { (void)sig; stop = 1; }

static int sleep_until_stopped(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    while (!stop) pause();
    return 0;
}

int main(int argc, char **argv) {
    if (argc >= 2 && strcmp(argv[1], "serve") == 0) {
        for (int i = 2; i < argc; i++) printf("%s\n", argv[i]);
        fflush(stdout);
        return sleep_until_stopped();
    }
    if (argc == 3 && strcmp(argv[1], "ls") == 0) {
        DIR *d = opendir(argv[2]);
        if (!d) { perror(argv[2]); return 1; }
        struct dirent *e;
        while ((e = readdir(d)) != NULL)
            if (e->d_name[0] != '.') printf("%s\n", e->d_name);
        closedir(d);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "cat") == 0) {
        int fd = open(argv[2], O_RDONLY);
        if (fd < 0) { perror(argv[2]); return 1; }
        char buf[4096];
        ssize_t n;
        while ((n = read(fd, buf, sizeof buf)) > 0) fwrite(buf, 1, (size_t)n, stdout);
        close(fd);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "alloc") == 0) {
        long mib = atol(argv[2]);
        for (long i = 0; i < mib; i++) {
            char *p = malloc(1 << 20);
            if (!p) { perror("malloc"); return 1; }
            memset(p, 1, 1 << 20);
        }
        printf("allocated %ld MiB\n", mib);
        fflush(stdout);
        return sleep_until_stopped();
    }
    if (argc == 4 && strcmp(argv[1], "connect") == 0) {
        struct sockaddr_in addr;
        memset(&addr, 0, sizeof addr);
        addr.sin_family = AF_INET;
        addr.sin_port = htons((unsigned short)atoi(argv[3]));
        if (inet_pton(AF_INET, argv[2], &addr.sin_addr) != 1) { fprintf(stderr, "bad IP\n"); return 2; }
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) { perror("connect"); return 1; }
        printf("connected\n");
        close(fd);
        return 0;
    }
    if (argc == 3 && strcmp(argv[1], "listen") == 0) {
        struct sockaddr_in addr;
        memset(&addr, 0, sizeof addr);
        addr.sin_family = AF_INET;
        addr.sin_port = htons((unsigned short)atoi(argv[2]));
        int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 16) != 0) {
            perror("listen");
            return 1;
        }
        for (;;) {
            struct sockaddr_in peer;
            socklen_t len = sizeof peer;
            int c = accept(fd, (struct sockaddr *)&peer, &len);
            if (c < 0) continue;
            char ip[INET_ADDRSTRLEN] = "?";
            inet_ntop(AF_INET, &peer.sin_addr, ip, sizeof ip);
            printf("accepted %s\n", ip);
            fflush(stdout);
            close(c);
        }
    }
    fprintf(stderr, "usage: probe serve LINE... | ls DIR | cat FILE | alloc MIB | connect IP PORT"
                    " | listen PORT\n");
    return 2;
}
