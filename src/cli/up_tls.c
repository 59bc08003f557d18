/* up_tls — see up_tls.h. */
#include "cli/up_tls.h"

#include "common/util.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* One shell script, so that the steps and their options read as the openssl manual
 * does; $1 is the directory. Nothing of it comes from the user but the path, passed as
 * an argument, never spliced into the text. */
static const char script[] =
    "set -eu\n"
    "umask 077\n"
    "cd \"$1\"\n"
    "rm -f ./*.crt ./*.key ./*.srl\n"
    "key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out \"$1\"; }\n"
    "key ca.key\n"
    "openssl req -x509 -new -key ca.key -subj '/CN=motor up local CA' -days 30 -out ca.crt \\\n"
    "  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign\n"
    "srv='basicConstraints=CA:FALSE\n"
    "keyUsage=critical,digitalSignature,keyEncipherment\n"
    "extendedKeyUsage=serverAuth,clientAuth\n"
    "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost'\n"
    "cli='basicConstraints=CA:FALSE\n"
    "keyUsage=critical,digitalSignature\n"
    "extendedKeyUsage=clientAuth'\n"
    "sign() { # name extensions\n"
    "  key \"$1.key\"\n"
    "  openssl req -new -key \"$1.key\" -subj \"/CN=motor up $1\" -out \"$1.csr\"\n"
    "  printf '%s\\n' \"$2\" >\"$1.ext\"\n"
    "  openssl x509 -req -in \"$1.csr\" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \\\n"
    "    -extfile \"$1.ext\" -out \"$1.crt\"\n"
    "  rm -f \"$1.csr\" \"$1.ext\"\n"
    "}\n"
    "sign " UP_TLS_MGMT " \"$srv\"\n"
    "sign " UP_TLS_INFER " \"$srv\"\n"
    "sign " UP_TLS_ENGINE " \"$srv\"\n"
    "sign " UP_TLS_CLIENT " \"$cli\"\n"
    "rm -f ca.srl\n";

static bool complete(const char *dir)
{
    static const char *const names[] = {UP_TLS_MGMT, UP_TLS_INFER, UP_TLS_ENGINE, UP_TLS_CLIENT};
    char p[4096];
    snprintf(p, sizeof(p), "%s/%s", dir, UP_TLS_CA);
    if (access(p, R_OK) != 0)
        return false;
    for (size_t i = 0; i < ARRAY_LEN(names); i++)
        for (int k = 0; k < 2; k++) {
            snprintf(p, sizeof(p), "%s/%s.%s", dir, names[i], k ? "key" : "crt");
            if (access(p, R_OK) != 0)
                return false;
        }
    return true;
}

int up_tls_make(const char *dir, bool keep, char *err, size_t cap)
{
    if (keep && complete(dir))
        return 0;
    if (mkdir(dir, 0700) < 0 && errno != EEXIST) {
        int e = errno;
        snprintf(err, cap, "cannot create %s: %s", dir, strerror(e));
        return -e;
    }
    char *log_path = xasprintf("%s/openssl.log", dir);
    int log_fd = open(log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    pid_t pid = log_fd < 0 ? -1 : fork();
    if (pid == 0) {
        dup2(log_fd, STDOUT_FILENO);
        dup2(log_fd, STDERR_FILENO);
        execl("/bin/sh", "sh", "-c", script, "motor-up-tls", dir, (char *)NULL);
        _exit(127);
    }
    int e = errno;
    if (log_fd >= 0)
        close(log_fd);
    int rc = 0;
    if (pid < 0) {
        snprintf(err, cap, "cannot run openssl: %s", strerror(e));
        rc = -e;
    } else {
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            snprintf(err, cap,
                     "making the certificates with the openssl CLI failed (is the `openssl` "
                     "package installed?); see %s",
                     log_path);
            rc = -EIO;
        }
    }
    free(log_path);
    return rc;
}
