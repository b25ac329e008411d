/*
 * spec_cluster_util.h - helpers for the speculative-decoding cluster
 * tests: a draft head trained in-process (a few seconds; exactness must
 * hold for any head, training only makes multi-token steps common), a
 * worker started with its stderr in a file, and counting lines of it.
 */
#ifndef BT_TESTS_SPEC_CLUSTER_UTIL_H
#define BT_TESTS_SPEC_CLUSTER_UTIL_H

#include "cluster_util.h"
#include "engine.h"
#include "spec/spec_train.h"

/* Trains a small aidreams260K head and writes it to path. */
__attribute__((unused)) static void scu_train_head(const char *model, const char *path)
{
    engine_config_t ecfg;
    engine_t *engine = NULL;
    spec_train_config_t tcfg;
    spec_train_data_t *data = NULL;
    spec_head_t *head = NULL;

    engine_config_init(&ecfg);
    ecfg.model_path = model;
    ecfg.device = "cpu";
    ecfg.backend.n_threads = 1;
    BT_ASSERT_OK(engine_create(&ecfg, &engine));
    spec_train_config_init(&tcfg);
    tcfg.n_tokens = 8192;
    tcfg.epochs = 3;
    tcfg.temperature = 0.5f;
    BT_ASSERT_OK(spec_train_data_create(engine, &tcfg, &data));
    BT_ASSERT_OK(spec_head_create(engine_model(engine), 0, 1, &head));
    BT_ASSERT_OK(spec_train(head, data, &tcfg, NULL));
    BT_ASSERT_OK(spec_head_save(head, path));
    spec_head_destroy(&head);
    spec_train_data_destroy(&data);
    engine_destroy(&engine);
}

/* Like cu_spawn, with the child's stderr (at INFO) appended to `log`. */
__attribute__((unused)) static pid_t scu_spawn_logged(const char *log, const char *exe, ...)
{
    char path[512];
    char *args[64];
    int n = 0;
    va_list ap;
    pid_t pid;

    snprintf(path, sizeof(path), "%s/%s", BT_BIN_DIR, exe);
    args[n++] = path;
    va_start(ap, exe);
    while (n < 63 && (args[n] = va_arg(ap, char *)) != NULL)
        n++;
    va_end(ap);
    args[n] = NULL;
    pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 2);
            close(fd);
        }
        setenv("BT_LOG", "INFO", 1);
        execv(path, args);
        _exit(127);
    }
    BT_CHECK(pid > 0 && cu_n_pids < CU_MAX_PROCS);
    cu_pids[cu_n_pids++] = pid;
    return pid;
}

#endif /* BT_TESTS_SPEC_CLUSTER_UTIL_H */
