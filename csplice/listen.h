/* SPDX-License-Identifier: MIT */
#pragma once

#define LISTEN_MAX_CONNECTIONS 16
#define LISTEN_BACKLOG 512

/* Runs the accept loop on the socket at argv[0] (options after it). Returns 0 in a forked child, with the
 * connection on stdin, for the caller to handle as one crash; 1 in the listener once it was asked to stop;
 * -errno (logged) when it could not listen. */
int listener_run(int argc, char *argv[]);
