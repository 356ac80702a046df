/* Internal to common/: the plan's key table (common/plan_keys.c), shared by
 * the loader (common/plan.c) and the plan.json writer (common/plan_json.c).
 * Everyone else reads plans through common/config.h. */
#ifndef MMP_COMMON_PLAN_SCHEMA_H
#define MMP_COMMON_PLAN_SCHEMA_H

#include "common/schema.h"

/* Every key of mmp_plan, in plan.json's order; fields are offsets in mmp_plan. */
extern const mmp_schema mmp_plan_schema;

#endif
