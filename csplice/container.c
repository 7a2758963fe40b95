/* SPDX-License-Identifier: MIT */
/*
 * Which container a crashed process is in, and the annotations of its OCI bundle that name it.
 *
 * Part of a cgroup path is the process's to choose: systemd delegates a subtree under user@UID.service to
 * every user, who may name a cgroup there after any container. So a bundle is read only when three things
 * agree: a cgroup component in the form a runtime itself writes, with no user manager anywhere in the
 * process's cgroups; a bundle of that runtime for that id under root's /run; and the process's namespaces,
 * which must be the ones of that bundle's init process and not the host's. Of config.json only the naming
 * annotations are kept (container_annotation_keys): its process.env is where Kubernetes puts secrets, and the
 * environment reaches a record only through collect_environ.
 */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "container.h"
#include "util.h"

/* config.json is read up to here: runtimes write process (args, env) and mounts before the annotations. */
#define BUNDLE_CONFIG_MAX (1024 * 1024)
/* Components tried as a container id: a cgroup path of a real container holds one or two. */
#define CANDIDATES_MAX 8

/* identity.py's names for pod, namespace, pod uid, container and image (CRI, CRI-O and Podman, nerdctl), and
 * the pod's own choice of what its crashes keep (corehandler/pods/policy.py), where the runtime passes pod
 * annotations into the bundle (Podman's kube play; containerd's pod_annotations).
 * `csplice --list-annotations` prints them; tests/local/test_csplice_contract.py holds the two sides together. */
const char *const container_annotation_keys[CONTAINER_ANNOTATION_KEYS] = {
        "io.kubernetes.cri.sandbox-name",
        "io.kubernetes.pod.name",
        "io.kubernetes.cri.sandbox-namespace",
        "io.kubernetes.pod.namespace",
        "nerdctl/namespace",
        "io.kubernetes.cri.sandbox-uid",
        "io.kubernetes.pod.uid",
        "io.kubernetes.cri.container-name",
        "io.kubernetes.container.name",
        "nerdctl/name",
        "io.kubernetes.cri.image-name",
        "io.kubernetes.cri-o.ImageName",
        "org.opencontainers.image.ref.name",
        "corehandler.io/core",
};

typedef enum Store {
        STORE_CRI_CONTAINERD, /* containerd's CRI namespace: Kubernetes */
        STORE_MOBY,           /* Docker's containerd namespace, the system's containerd or dockerd's own */
        STORE_CONTAINERS,     /* containers/storage: CRI-O and rootful Podman */
        _STORE_MAX,
} Store;

/* Bundle directories; each holds config.json and the init's PID (containerd's shims write init.pid, conmon's
 * --container-pidfile is userdata/pidfile). */
static const char *const store_dirs[_STORE_MAX][3] = {
        [STORE_CRI_CONTAINERD] = { "/run/containerd/io.containerd.runtime.v2.task/k8s.io/%s" },
        [STORE_MOBY] = { "/run/containerd/io.containerd.runtime.v2.task/moby/%s",
                         "/run/docker/containerd/daemon/io.containerd.runtime.v2.task/moby/%s",
                         "/run/docker/containerd/daemon/io.containerd.runtime.v1.linux/moby/%s" },
        [STORE_CONTAINERS] = { "/run/containers/storage/overlay-containers/%s/userdata",
                               "/var/lib/containers/storage/overlay-containers/%s/userdata" },
};

/* The cgroup components runtimes create for a container: prefix, 64 hex digits, suffix; or the bare id below a
 * parent (cgroupfs drivers). */
typedef struct Form {
        const char *prefix, *suffix;
        const char *parent; /* the component above must be this, or start with it when it ends in '*' */
        const char *runtime;
        Store store;
} Form;

static const Form forms[] = {
        { "docker-", ".scope", NULL, "docker", STORE_MOBY },                      /* systemd driver */
        { "", "", "docker", "docker", STORE_MOBY },                               /* /docker/ID */
        { "cri-containerd-", ".scope", NULL, "containerd", STORE_CRI_CONTAINERD }, /* kubepods.slice/... */
        { "", "", "pod*", "containerd", STORE_CRI_CONTAINERD },                   /* /kubepods/QOS/podUID/ID */
        { "crio-", ".scope", NULL, "cri-o", STORE_CONTAINERS },
        { "crio-", "", NULL, "cri-o", STORE_CONTAINERS },                         /* cgroupfs driver */
        { "libpod-", ".scope", NULL, "podman", STORE_CONTAINERS },
        { "libpod-", "", NULL, "podman", STORE_CONTAINERS },                      /* /libpod_parent/libpod-ID */
};

static bool is_hex_run(const char *s, size_t n) {
        for (size_t i = 0; i < n; i++)
                if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
                        return false;
        return true;
}

static bool component_is(const char *c, size_t len, const char *s) {
        return strlen(s) == len && memcmp(c, s, len) == 0;
}

static bool parent_matches(const Form *f, const char *parent, size_t len) {
        size_t n;

        if (!f->parent)
                return true;
        n = strlen(f->parent);
        if (f->parent[n - 1] == '*')
                return len >= n - 1 && memcmp(parent, f->parent, n - 1) == 0;
        return component_is(parent, len, f->parent);
}

/* The id in component c (len bytes) if it has form f. */
static bool match_form(const Form *f, const char *c, size_t len, const char *parent, size_t parent_len,
                       char id[65]) {
        size_t pre = strlen(f->prefix), suf = strlen(f->suffix);

        if (len != pre + 64 + suf || memcmp(c, f->prefix, pre) != 0 || memcmp(c + pre + 64, f->suffix, suf) != 0 ||
            !is_hex_run(c + pre, 64) || !parent_matches(f, parent, parent_len))
                return false;
        memcpy(id, c + pre, 64);
        id[64] = '\0';
        return true;
}

/* Whether a user manager (user@UID.service) is an ancestor in any of the process's cgroups: below it every
 * name is the user's. */
static bool under_user_manager(const char *cgroup) {
        for (const char *p = strstr(cgroup, "/user@"); p; p = strstr(p + 1, "/user@")) {
                size_t len = strcspn(p + 1, "/\n");
                if (len > strlen("user@.service") && memcmp(p + 1 + len - strlen(".service"), ".service", 8) == 0)
                        return true;
        }
        return false;
}

static int read_ns(const char *proc_root, const char *who, const char *name, char *buf, size_t size) {
        char path[PATH_MAX];
        ssize_t n;

        (void) snprintf(path, sizeof path, "%s/%s/ns/%s", proc_root, who, name);
        n = readlink(path, buf, size - 1);
        if (n <= 0)
                return n < 0 ? -errno : -ENOENT;
        buf[n] = '\0';
        return 0;
}

/* The bundle's init process, from the PID file its runtime wrote. */
static int bundle_init_pid(const char dir[static PATH_MAX - 64], char ret[static 16]) {
        static const char *const names[] = { "init.pid", "pidfile" };
        char path[PATH_MAX], *buf = NULL, *end;
        long pid;

        for (size_t i = 0; i < ELEMENTSOF(names); i++) {
                (void) snprintf(path, sizeof path, "%s/%s", dir, names[i]);
                if (read_bounded_at(AT_FDCWD, path, 32, &buf, NULL) < 0)
                        continue;
                errno = 0;
                pid = strtol(buf, &end, 10);
                if (errno == 0 && end != buf && (!*end || *end == '\n') && pid > 1 && pid <= INT_MAX) {
                        (void) snprintf(ret, 16, "%ld", pid);
                        free(buf);
                        return 0;
                }
                free(buf);
        }
        return -ENOENT;
}

/* Whether mnt_ns is the host's: PID 1's, or ours (the kernel starts us in its initial namespaces; socket mode's
 * unit may give us a private one). Some sandboxes hide PID 1's namespaces even from root: one readable
 * reference is enough, none is "can't tell", which counts as the host's. */
static bool is_host_mount_ns(const char *proc_root, const char *mnt_ns) {
        static const char *const refs[] = { "1", "self" };
        bool known = false;
        char ref[48];

        for (size_t i = 0; i < ELEMENTSOF(refs); i++) {
                if (read_ns(proc_root, refs[i], "mnt", ref, sizeof ref) < 0)
                        continue;
                if (strcmp(ref, mnt_ns) == 0)
                        return true;
                known = true;
        }
        return !known;
}

/* In the container: the mount and PID namespaces of its init, and a mount namespace that is not the host's
 * (a stale PID file may name a host process now). A hostPID pod shares the host's PID namespace, never its
 * mount namespace. */
static bool shares_namespaces(const char *proc_root, const char *init, const char *mnt_ns, const char *pid_ns) {
        char init_mnt[48], init_pid[48];

        if (!mnt_ns[0] || !pid_ns[0] || is_host_mount_ns(proc_root, mnt_ns))
                return false;
        if (read_ns(proc_root, init, "mnt", init_mnt, sizeof init_mnt) < 0 ||
            read_ns(proc_root, init, "pid", init_pid, sizeof init_pid) < 0)
                return false;
        return strcmp(mnt_ns, init_mnt) == 0 && strcmp(pid_ns, init_pid) == 0;
}

/* ---- the annotations of config.json: a bounded, non-recursive reader of just enough JSON ---- */

static const char *skip_ws(const char *p, const char *end) {
        while (p < end && (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
                p++;
        return p;
}

static bool hex4(const char *p, const char *end, unsigned *ret) {
        unsigned v = 0;

        if (end - p < 4)
                return false;
        for (int i = 0; i < 4; i++) {
                char c = p[i];
                int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 :
                        c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
                if (d < 0)
                        return false;
                v = v * 16 + (unsigned) d;
        }
        *ret = v;
        return true;
}

static size_t utf8_encode(unsigned cp, char *out) {
        if (cp < 0x80) {
                out[0] = (char) cp;
                return 1;
        }
        if (cp < 0x800) {
                out[0] = (char) (0xC0 | (cp >> 6));
                out[1] = (char) (0x80 | (cp & 0x3F));
                return 2;
        }
        if (cp < 0x10000) {
                out[0] = (char) (0xE0 | (cp >> 12));
                out[1] = (char) (0x80 | ((cp >> 6) & 0x3F));
                out[2] = (char) (0x80 | (cp & 0x3F));
                return 3;
        }
        out[0] = (char) (0xF0 | (cp >> 18));
        out[1] = (char) (0x80 | ((cp >> 12) & 0x3F));
        out[2] = (char) (0x80 | ((cp >> 6) & 0x3F));
        out[3] = (char) (0x80 | (cp & 0x3F));
        return 4;
}

/* The JSON string at p, decoded into out (size bytes, NUL-terminated) when out is given and it fits (*fits
 * says). Returns the position after its closing quote, or NULL when malformed or cut off. */
static const char *read_string(const char *p, const char *end, char *out, size_t size, bool *fits) {
        size_t n = 0;

        *fits = out != NULL;
        if (p >= end || *p != '"')
                return NULL;
        for (p++; p < end; p++) {
                char buf[4] = { *p };
                size_t len = 1;
                unsigned cp, lo;

                if (*p == '"') {
                        if (*fits)
                                out[n] = '\0';
                        return p + 1;
                }
                if ((unsigned char) *p < 0x20)
                        return NULL;
                if (*p == '\\') {
                        if (++p >= end)
                                return NULL;
                        switch (*p) {
                        case '"': case '\\': case '/': buf[0] = *p; break;
                        case 'b': buf[0] = '\b'; break;
                        case 'f': buf[0] = '\f'; break;
                        case 'n': buf[0] = '\n'; break;
                        case 'r': buf[0] = '\r'; break;
                        case 't': buf[0] = '\t'; break;
                        case 'u':
                                if (!hex4(p + 1, end, &cp))
                                        return NULL;
                                p += 4;
                                if (cp >= 0xD800 && cp < 0xDC00 && end - p >= 7 && p[1] == '\\' && p[2] == 'u' &&
                                    hex4(p + 3, end, &lo) && lo >= 0xDC00 && lo < 0xE000) {
                                        cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                                        p += 6;
                                }
                                len = utf8_encode(cp, buf);
                                break;
                        default:
                                return NULL;
                        }
                }
                if (*fits && n + len < size) {
                        memcpy(out + n, buf, len);
                        n += len;
                } else
                        *fits = false;
        }
        return NULL;
}

/* Skips one value of any kind, counting brackets instead of recursing: a hostile file may nest deeply. */
static const char *skip_value(const char *p, const char *end) {
        size_t depth = 0;
        bool fits;

        do {
                p = skip_ws(p, end);
                if (p >= end)
                        return NULL;
                if (*p == '"')
                        p = read_string(p, end, NULL, 0, &fits);
                else if (*p == '{' || *p == '[')
                        depth++, p++;
                else if (*p == '}' || *p == ']') {
                        if (depth == 0)
                                return NULL;
                        depth--, p++;
                } else if (*p == ',' || *p == ':') {
                        if (depth == 0)
                                return NULL;
                        p++;
                } else {
                        const char *start = p;
                        while (p < end && *p && strchr("+-.0123456789Eeabflnrstu", *p))
                                p++;
                        if (p == start)
                                return NULL;
                }
                if (!p)
                        return NULL;
        } while (depth > 0);
        return p;
}

/* Steps through an object's members: first with *p at its '{', then with *p after each member's value.
 * Returns 1 with key read (*fits: whole) and *p at the value, 0 at the closing brace, -EBADMSG when the text
 * is malformed or cut off. */
static int next_member(const char **p, const char *end, bool first, char *key, size_t size, bool *fits) {
        const char *q = skip_ws(*p, end);

        if (q >= end || *q != (first ? '{' : *q == '}' ? '}' : ','))
                return -EBADMSG;
        if (*q == '}')
                return 0;
        q = skip_ws(q + 1, end);
        if (first && q < end && *q == '}')
                return 0;
        q = read_string(q, end, key, size, fits);
        if (!q)
                return -EBADMSG;
        q = skip_ws(q, end);
        if (q >= end || *q != ':')
                return -EBADMSG;
        *p = skip_ws(q + 1, end);
        return 1;
}

static int annotation_index(const char *key) {
        for (size_t i = 0; i < CONTAINER_ANNOTATION_KEYS; i++)
                if (strcmp(key, container_annotation_keys[i]) == 0)
                        return (int) i;
        return -1;
}

static void read_annotations(Container *c, const char *p, const char *end) {
        char key[64], value[CONTAINER_VALUE_MAX + 1];
        bool fits;

        for (bool first = true; next_member(&p, end, first, key, sizeof key, &fits) > 0; first = false) {
                int i = fits ? annotation_index(key) : -1;
                bool whole;

                if (i >= 0 && *p == '"') {
                        p = read_string(p, end, value, sizeof value, &whole);
                        if (p && whole && !c->values[i])
                                c->values[i] = strdup(value);
                } else
                        p = skip_value(p, end);
                if (!p)
                        return;
        }
}

/* The "annotations" member of config.json's top-level object, whatever comes before it. */
static void parse_config(Container *c, const char *p, const char *end) {
        char key[16];
        bool fits;

        for (bool first = true; next_member(&p, end, first, key, sizeof key, &fits) > 0; first = false) {
                if (fits && strcmp(key, "annotations") == 0 && *p == '{') {
                        read_annotations(c, p, end);
                        return;
                }
                p = skip_value(p, end);
                if (!p)
                        return;
        }
}

/* ---- */

/* The i-th bundle directory of store for id, under the tests' CSPLICE_BUNDLE_ROOT; false past the last. */
static bool store_dir(Store store, size_t i, const char id[65], char dir[static PATH_MAX - 64]) {
        const char *root = getenv("CSPLICE_BUNDLE_ROOT") ?: ""; /* tests only: the kernel passes no environment */
        char rel[256];

        if (i >= ELEMENTSOF(store_dirs[store]) || !store_dirs[store][i])
                return false;
        (void) snprintf(rel, sizeof rel, store_dirs[store][i], id);
        (void) snprintf(dir, PATH_MAX - 64, "%s%s", root, rel);
        return true;
}

/* The init's PID file and config.json are looked for in each of the store's directories on their own: Podman
 * writes conmon's PID file into its run dir (/run/containers/...) and the bundle into its static dir
 * (/var/lib/containers/...), where CRI-O and the containerd shims keep both in one. */
static bool try_bundle(Container *c, const char *proc_root, const Form *f, const char id[65], const char *mnt_ns,
                       const char *pid_ns) {
        char dir[PATH_MAX - 64], path[PATH_MAX], init[16], *config = NULL;
        bool found = false;
        size_t len;

        for (size_t i = 0; !found && store_dir(f->store, i, id, dir); i++)
                found = bundle_init_pid(dir, init) >= 0;
        if (!found || !shares_namespaces(proc_root, init, mnt_ns, pid_ns))
                return false;
        for (size_t i = 0; store_dir(f->store, i, id, dir); i++) {
                (void) snprintf(path, sizeof path, "%s/config.json", dir);
                if (read_bounded_at(AT_FDCWD, path, BUNDLE_CONFIG_MAX, &config, &len) < 0)
                        continue;
                memcpy(c->id, id, 65);
                c->runtime = f->runtime;
                parse_config(c, config, config + len);
                free(config);
                return true;
        }
        return false;
}

int container_find(Container *ret, const char *proc_root, const char *cgroup, const char *mnt_ns,
                   const char *pid_ns) {
        unsigned tried = 0;

        *ret = (Container) {};
        if (!cgroup || under_user_manager(cgroup))
                return 0;
        /* Every hierarchy's path ("hierarchy:controllers:/a/b"), every component with the one above it. */
        for (const char *line = cgroup; *line; line += strcspn(line, "\n"), line += *line == '\n') {
                const char *path = strchr(line, ':'), *eol = line + strcspn(line, "\n");
                const char *parent = "", *comp;
                size_t parent_len = 0;

                path = path && path < eol ? strchr(path + 1, ':') : NULL;
                if (!path || path >= eol)
                        continue;
                for (comp = path + 1; comp < eol; ) {
                        const char *slash;
                        size_t len;
                        char id[65];

                        comp += *comp == '/';
                        slash = memchr(comp, '/', (size_t) (eol - comp));
                        len = (size_t) ((slash ?: eol) - comp);
                        for (size_t f = 0; f < ELEMENTSOF(forms) && tried < CANDIDATES_MAX; f++) {
                                if (!match_form(&forms[f], comp, len, parent, parent_len, id))
                                        continue;
                                tried++;
                                if (try_bundle(ret, proc_root, &forms[f], id, mnt_ns, pid_ns))
                                        return 1;
                        }
                        parent = comp;
                        parent_len = len;
                        comp += len;
                }
        }
        return 0;
}

void container_free(Container *c) {
        for (size_t i = 0; i < CONTAINER_ANNOTATION_KEYS; i++)
                free(c->values[i]);
        *c = (Container) {};
}
