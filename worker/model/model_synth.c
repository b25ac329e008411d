/* model_synth.c - seeded random models (in progress). */
#include "model_int.h"

#include "bt_error.h"

bt_status_t model__load_synth(const char *spec, model_t **model_p)
{
    (void)model_p;
    return BT_ERROR(BT_ERR_UNSUPPORTED, "MODEL", "synth not built yet (%s)",
                    spec);
}
