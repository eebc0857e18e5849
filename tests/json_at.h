/* json_at.h - a value of a parsed JSON answer by path, for the HTTP tests:
 * at(o, "choices.0.message.content") walks object keys and array indices
 * (a part starting with a digit), NULL where the path leads nowhere.
 * Header-only, for tests. */
#ifndef KVC_TEST_JSON_AT_H
#define KVC_TEST_JSON_AT_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const cJSON *at(const cJSON *o, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    const cJSON *v = o;
    for (char *save, *k = strtok_r(buf, ".", &save); v && k; k = strtok_r(NULL, ".", &save))
        v = k[0] >= '0' && k[0] <= '9' ? cJSON_GetArrayItem(v, atoi(k))
                                       : cJSON_GetObjectItemCaseSensitive(v, k);
    return v;
}

#endif
