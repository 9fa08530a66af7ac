/* The rendezvous file of a multi-process launch (one process per GPU, on one host or many): how rank 0 hands
 * NCCL's 128-byte unique id (comm.h k3c_comm_nccl_unique_id) to the other ranks through a path every rank
 * sees (a local path on one host, a shared filesystem across hosts), and where a rank that fails later leaves
 * a note naming itself.
 *
 * Protocol: rank 0 writes one fixed-size record to PATH.tmp.<pid> and renames it over PATH; rename is atomic
 * within a filesystem, so a reader finds no file, an older file or the whole new record, never part of it.
 * The other ranks poll PATH (every 20 ms) until they find a record they accept or their timeout passes. A
 * record is refused, and the reader goes on waiting for rank 0 to replace it (naming the reason when the
 * time runs out), when it is
 *   - truncated or not a k3c record: another size, magic or checksum;
 *   - for another world size;
 *   - stale: written more than the timeout before this reader began to wait (the ranks of one launch start
 *     within one timeout of each other, or the first of them has given up already), or written on this host
 *     by a process that no longer runs.
 * Rank 0 removes PATH once every rank has joined, so a later launch does not find this one's id.
 *
 * Failure notes: PATH.failed.<rank> holds the step, the time and the message of a rank that failed after the
 * group formed (written the same way, temporary name then rename); the other ranks read the earliest one to
 * name the rank that failed first (clocks of different hosts are compared: a note of the same failure's echo
 * on another host comes milliseconds later, more than NTP's skew).
 * Rank 0 clears old notes before it publishes a new id. */
#ifndef K3C_COMM_RENDEZVOUS_H
#define K3C_COMM_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#define K3C_RENDEZVOUS_ID_BYTES 128

/* The record as it lies in the file (host byte order: every rank runs the same binary on the same
 * architecture). check: FNV-1a 64 of every byte before it. */
typedef struct k3c_rendezvous_record {
    char magic[8];          /* "K3CRDV01" */
    uint32_t world_size;
    uint32_t pid;           /* rank 0's process */
    uint64_t written_ns;    /* CLOCK_REALTIME when rank 0 wrote it */
    char host[64];          /* rank 0's host name, NUL-padded */
    unsigned char id[K3C_RENDEZVOUS_ID_BYTES];
    uint64_t check;
} k3c_rendezvous_record;

/* Rank 0: clears old failure notes of `world_size` ranks, then writes the record atomically. */
int k3c_rendezvous_publish(const char *path, const unsigned char id[K3C_RENDEZVOUS_ID_BYTES], int world_size);
/* The other ranks: waits up to timeout_ms for a record it accepts (above) and copies its id. The error names
 * the path and why no record was taken (none appeared, or the last one seen and why it was refused). */
int k3c_rendezvous_wait(const char *path, int world_size, int timeout_ms, unsigned char id[K3C_RENDEZVOUS_ID_BYTES]);
/* Rank 0, once every rank has joined. */
void k3c_rendezvous_remove(const char *path);

/* A record as publish writes it, with the given pid, time and host (tests write stale ones with it). */
void k3c_rendezvous_record_fill(k3c_rendezvous_record *r, const unsigned char id[K3C_RENDEZVOUS_ID_BYTES],
                                int world_size, uint32_t pid, uint64_t written_ns, const char *host);

/* Failure notes. note: 0 or -1 (a note that cannot be written is only a worse message, the caller goes on).
 * find: 1 and the earliest note among ranks 0 .. world_size - 1, 0 when there is none. */
int k3c_rendezvous_note_failure(const char *path, int rank, long step, const char *msg);
int k3c_rendezvous_find_failure(const char *path, int world_size, int *rank, long *step, char *msg, size_t cap);
void k3c_rendezvous_clear_failures(const char *path, int world_size);

#endif
