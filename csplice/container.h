/* SPDX-License-Identifier: MIT */
#pragma once

#include <stddef.h>

/* The annotations of an OCI bundle that name a container: the only part of config.json csplice keeps. */
#define CONTAINER_ANNOTATION_KEYS 14
extern const char *const container_annotation_keys[CONTAINER_ANNOTATION_KEYS];
/* Longer values are dropped: Kubernetes names are at most 253 bytes, image references rarely longer. */
#define CONTAINER_VALUE_MAX 256

typedef struct Container {
        char id[65];                                        /* "" when the process is in no container we know */
        const char *runtime;                                /* "docker", "containerd", "cri-o" or "podman" */
        char *values[CONTAINER_ANNOTATION_KEYS];            /* per container_annotation_keys, NULL if absent */
} Container;

/* Finds the container of the process whose /proc/PID/cgroup text is cgroup and whose namespace readlinks are
 * mnt_ns and pid_ns ("mnt:[4026531841]"), and reads its bundle's naming annotations. Returns 1 when found,
 * 0 when the process is in no container whose bundle and namespaces vouch for it. */
int container_find(Container *ret, const char *proc_root, const char *cgroup, const char *mnt_ns,
                   const char *pid_ns);

void container_free(Container *c);
