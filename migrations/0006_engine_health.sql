-- Engine health: one row per engine, what rotation reads to choose one (workflows/rotation.py)
-- and where every capacity state and circuit change is persisted (store/engine_health.py).
-- Keep store/models_engines.py in step: tests/integration/test_migrations.py fails on any drift.
--
-- Credits are not a rate limit: a CreditsExhausted engine has no reset time and can never
-- acquire one. This table is the third layer that holds it (after the type in
-- workflows/capacity.py and the probe property test): CHECK credits_never_have_a_deadline.
-- CHECK constraints fire in name order, so a row breaking both it and
-- resets_at_only_for_windows is refused by name as credits_never_have_a_deadline.

CREATE TABLE engine_health (
    engine_id text PRIMARY KEY,
    -- what the engine is (from its descriptor and `vibey doctor`)
    installed boolean NOT NULL DEFAULT false,
    local boolean NOT NULL DEFAULT false,
    weight integer NOT NULL DEFAULT 1,
    capabilities text[] NOT NULL DEFAULT '{}',
    -- the last doctor run, passed or not; the time it passed (NULL once a later run failed)
    last_doctor_at timestamptz,
    authenticated_at timestamptz,
    -- capacity (workflows/capacity.py)
    capacity_state text NOT NULL DEFAULT 'Available',
    resets_at timestamptz,
    capacity_detail text NOT NULL DEFAULT '',
    -- the circuit (workflows/circuit.py)
    circuit_state text NOT NULL DEFAULT 'closed',
    consecutive_failures integer NOT NULL DEFAULT 0,
    opened_at timestamptz,
    probes integer NOT NULL DEFAULT 0,
    probe_kind text,
    probe_at timestamptz,
    -- smooth weighted round robin's current weight; NULL: not in the set the last selection
    -- was made over
    rotation_weight integer,
    updated_at timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT credits_never_have_a_deadline CHECK (
        NOT (capacity_state = 'CreditsExhausted' AND resets_at IS NOT NULL)
    ),
    CONSTRAINT resets_at_only_for_windows CHECK (
        (capacity_state = 'WindowExhausted') = (resets_at IS NOT NULL)
    ),
    CONSTRAINT deadline_probes_only_for_windows CHECK (
        probe_kind IS DISTINCT FROM 'deadline' OR capacity_state = 'WindowExhausted'
    ),
    CONSTRAINT engine_health_capacity_state CHECK (
        capacity_state IN ('Available', 'WindowExhausted', 'CreditsExhausted', 'AuthenticationFailed')
    ),
    CONSTRAINT engine_health_circuit_state CHECK (circuit_state IN ('closed', 'open', 'half_open')),
    CONSTRAINT engine_health_probe_kind CHECK (probe_kind IN ('backoff', 'deadline')),
    CONSTRAINT engine_health_open_circuit CHECK (
        (circuit_state = 'closed') = (opened_at IS NULL)
        AND (circuit_state = 'closed') = (probe_kind IS NULL)
        AND (probe_kind IS NULL) = (probe_at IS NULL)
    ),
    CONSTRAINT engine_health_counts CHECK (
        weight >= 0 AND consecutive_failures >= 0 AND probes >= 0
    ),
    CONSTRAINT engine_health_authenticated_by_last_doctor CHECK (
        authenticated_at IS NULL OR authenticated_at IS NOT DISTINCT FROM last_doctor_at
    )
);
