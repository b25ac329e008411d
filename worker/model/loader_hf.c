/* loader_hf.c - Hugging Face directories (in progress). */
#include "model_int.h"

#include "bt_error.h"

bt_status_t model__load_hf(const char *path, model_t **model_p)
{
    (void)model_p;
    return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL",
                    "Hugging Face loader not built yet (%s)", path);
}

bt_status_t model_hf_config_parse(const char *json, size_t len,
                                  const char *gen_json, size_t gen_len,
                                  model_config_t *cfg_p, char *arch,
                                  size_t arch_len)
{
    (void)json; (void)len; (void)gen_json; (void)gen_len; (void)cfg_p;
    (void)arch; (void)arch_len;
    return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "not built yet");
}
