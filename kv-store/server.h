/* The kv-store's gRPC methods: adapts common/rpc.h calls to the transport-independent service
 * (service.h). Unary methods take one message and send one reply; PutKv reads chunks until the
 * client half-closes; Attend is a long-lived bidirectional stream (recv -> attend -> send until
 * EOF), so a worker pays no call setup per decode step. A failing request ends its call with
 * the service's status. */
#ifndef KVS_SERVER_H
#define KVS_SERVER_H

#include "rpc.h"
#include "service.h"

/* Method paths of proto/kvstore.proto's service rakv.KvStore. */
#define KVS_METHOD_OPEN_SESSION "/rakv.KvStore/OpenSession"
#define KVS_METHOD_PUT_KV "/rakv.KvStore/PutKv"
#define KVS_METHOD_APPEND "/rakv.KvStore/Append"
#define KVS_METHOD_BUILD_INDEX "/rakv.KvStore/BuildIndex"
#define KVS_METHOD_ATTEND "/rakv.KvStore/Attend"
#define KVS_METHOD_ATTEND_BATCH "/rakv.KvStore/AttendBatch"
#define KVS_METHOD_PUT_CLUSTERS "/rakv.KvStore/PutClusters"
#define KVS_METHOD_FETCH_CLUSTERS "/rakv.KvStore/FetchClusters"
#define KVS_METHOD_CLOSE_SESSION "/rakv.KvStore/CloseSession"
#define KVS_METHOD_STATS "/rakv.KvStore/Stats"
#define KVS_METHOD_HEALTH "/rakv.KvStore/Health"
#define KVS_METHOD_READ_KV "/rakv.KvStore/ReadKv"

/* Registers every method on `s` (before ra_rpc_server_start). */
int kvs_server_register(ra_rpc_server *s, kvs_service *svc, ra_error *err);

#endif
