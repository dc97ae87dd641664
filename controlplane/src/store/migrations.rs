//! The schema, as one append-only list of migrations (moved here unchanged
//! from db.rs: an existing database opens as it did).

/// Schema migrations; `PRAGMA user_version` is the number applied. Append
/// only: a shipped migration never changes.
pub(crate) const MIGRATIONS: &[&str] = &[
    // 1: tokens, nodes, certificates, events, settings.
    r#"
    CREATE TABLE settings (
        key   TEXT PRIMARY KEY,
        value TEXT NOT NULL
    ) STRICT;

    CREATE TABLE join_tokens (
        id            TEXT PRIMARY KEY,
        secret_sha256 BLOB NOT NULL CHECK (length(secret_sha256) = 32),
        role          TEXT NOT NULL,
        uses_left     INTEGER NOT NULL CHECK (uses_left >= 0),
        expires_at    INTEGER NOT NULL,
        revoked_at    INTEGER,
        created_at    INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE nodes (
        id                  TEXT PRIMARY KEY,
        role                TEXT NOT NULL,
        identity_generation INTEGER NOT NULL CHECK (identity_generation >= 1),
        attestor            TEXT NOT NULL,
        joined_at           INTEGER NOT NULL,
        retired_at          INTEGER
    ) STRICT;

    CREATE TABLE node_certs (
        serial              TEXT PRIMARY KEY,
        node_id             TEXT NOT NULL REFERENCES nodes(id),
        identity_generation INTEGER NOT NULL,
        der                 BLOB NOT NULL,
        not_before          INTEGER NOT NULL,
        not_after           INTEGER NOT NULL,
        revoked_at          INTEGER
    ) STRICT;
    CREATE INDEX node_certs_by_node ON node_certs(node_id, identity_generation);

    CREATE TABLE events (
        id        INTEGER PRIMARY KEY AUTOINCREMENT,
        type      TEXT NOT NULL,
        at        INTEGER NOT NULL,
        attestor  TEXT,
        reason    TEXT,
        token_id  TEXT,
        node_id   TEXT,
        data      TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(data))
    ) STRICT;
    CREATE INDEX events_by_type ON events(type, id);
    "#,
    // 2: pools, hardware bindings, the joins audit, and the tpm attestor's
    // EK roots, resolve allow-list and enrollment requests.
    r#"
    CREATE TABLE pools (
        id         TEXT PRIMARY KEY,
        owner      TEXT NOT NULL,
        policy     TEXT NOT NULL DEFAULT '{}' CHECK (json_valid(policy)),
        created_at INTEGER NOT NULL
    ) STRICT;
    INSERT INTO pools (id, owner, policy, created_at)
        VALUES ('default', 'root', '{}', CAST(strftime('%s', 'now') AS INTEGER) * 1000);

    -- No REFERENCES: SQLite cannot add a foreign key column with a non-NULL
    -- default. Pools are never deleted, and every writer checks the pool.
    ALTER TABLE nodes ADD COLUMN pool_id TEXT NOT NULL DEFAULT 'default';
    ALTER TABLE join_tokens ADD COLUMN pool_id TEXT;

    -- A hardware key (kind 'tpm-ek': SHA-256 of the EK's SPKI) bound to the
    -- one node it may ever admit; one binding per node and kind.
    CREATE TABLE node_bindings (
        kind       TEXT NOT NULL,
        key        TEXT NOT NULL,
        node_id    TEXT NOT NULL REFERENCES nodes(id),
        created_at INTEGER NOT NULL,
        PRIMARY KEY (kind, key),
        UNIQUE (node_id, kind)
    ) STRICT;

    -- One row per admitted join (new node or reclaim).
    CREATE TABLE joins (
        id                  INTEGER PRIMARY KEY AUTOINCREMENT,
        node_id             TEXT NOT NULL REFERENCES nodes(id),
        attestor            TEXT NOT NULL,
        node_key            TEXT NOT NULL CHECK (node_key IN ('tpm', 'unattested')),
        identity_generation INTEGER NOT NULL,
        at                  INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX joins_by_node ON joins(node_id, id);

    CREATE TABLE ek_roots (
        sha256    TEXT PRIMARY KEY,
        der       BLOB NOT NULL,
        subject   TEXT NOT NULL,
        not_after INTEGER NOT NULL,
        added_at  INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE tpm_resolve (
        ek_sha256  TEXT PRIMARY KEY,
        pool_id    TEXT,
        node_id    TEXT,
        created_at INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE join_requests (
        id         TEXT PRIMARY KEY,
        attestor   TEXT NOT NULL,
        ek_sha256  TEXT NOT NULL,
        ek_issuer  TEXT NOT NULL,
        ek_serial  TEXT NOT NULL,
        status     TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied')),
        pool_id    TEXT,
        created_at INTEGER NOT NULL,
        decided_at INTEGER,
        used_at    INTEGER
    ) STRICT;
    -- At most one open (not yet used) request per EK: a pending one is
    -- answered again, a denied one stays denied.
    CREATE UNIQUE INDEX join_requests_open ON join_requests(ek_sha256) WHERE used_at IS NULL;
    "#,
    // 3: the node lifecycle (cordon, delete). A deleted node keeps its row,
    // so its certificates, joins and events keep naming a node, but no
    // lookup of a live node finds it again.
    r#"
    ALTER TABLE nodes ADD COLUMN cordoned_at INTEGER;
    ALTER TABLE nodes ADD COLUMN deleted_at INTEGER;
    "#,
    // 4: a token's expect binding: the machine it was minted for, by product
    // UUID and/or MAC (normalized lowercase; NULL: not bound). JoinService
    // compares them with the join's hardware claims.
    r#"
    ALTER TABLE join_tokens ADD COLUMN expect_product_uuid TEXT;
    ALTER TABLE join_tokens ADD COLUMN expect_mac TEXT;
    "#,
    // 5: event retention prunes by time (oldest first, in bounded batches).
    r#"
    CREATE INDEX events_by_at ON events(at);
    "#,
    // 6: single-use evidence (spec "Single-use evidence"): what an attestor
    // accepted, recorded in the join transaction so that the same evidence
    // admits once, across restarts and replicas. `subject` is a digest the
    // attestor chooses (a TPM challenge, an x509pop proof); rows past
    // `expires_at` are pruned (see `uses`).
    r#"
    CREATE TABLE attestation_uses (
        attestor   TEXT NOT NULL,
        subject    TEXT NOT NULL,
        expires_at INTEGER NOT NULL,
        PRIMARY KEY (attestor, subject)
    ) STRICT;
    CREATE INDEX attestation_uses_expiry ON attestation_uses (expires_at);
    "#,
    // 7: discovery. Sites; the site a token admits to and a node belongs to;
    // what a node may be sent (`allowed_kinds`, a JSON array; NULL: no
    // restriction) and how long its certificates may last (ramdisks); boot
    // entries (machines to commission, each with its single-use discovery
    // token, whose secret is kept sealed for the lease holder); leases.
    r#"
    CREATE TABLE sites (
        id         TEXT PRIMARY KEY,
        name       TEXT NOT NULL UNIQUE,
        created_at INTEGER NOT NULL
    ) STRICT;
    ALTER TABLE join_tokens ADD COLUMN site_id TEXT;
    ALTER TABLE nodes ADD COLUMN site_id TEXT;
    ALTER TABLE nodes ADD COLUMN allowed_kinds TEXT CHECK (allowed_kinds IS NULL OR json_valid(allowed_kinds));
    ALTER TABLE nodes ADD COLUMN max_cert_ttl_ms INTEGER;

    CREATE TABLE boot_entries (
        workflow_id   TEXT PRIMARY KEY,
        site_id       TEXT NOT NULL REFERENCES sites(id),
        mac           TEXT NOT NULL,
        product_uuid  TEXT,
        token_id      TEXT NOT NULL REFERENCES join_tokens(id),
        sealed_secret BLOB NOT NULL,
        not_after     INTEGER NOT NULL,
        created_at    INTEGER NOT NULL,
        vouched_at    INTEGER,
        joined_at     INTEGER,
        node_id       TEXT
    ) STRICT;
    CREATE INDEX boot_entries_by_site ON boot_entries(site_id, created_at);

    CREATE TABLE leases (
        name       TEXT PRIMARY KEY,
        holder     TEXT,
        epoch      INTEGER NOT NULL,
        expires_at INTEGER NOT NULL
    ) STRICT;
    "#,
    // 8: provisioned tokens and hardware keys (spec "provisioned", "join-token":
    // the reclaim flag). A token may name the node it re-keys and may allow a
    // reclaim; a node records its trusted hardware key (`tpm-ek:<sha256>` or
    // `product-uuid:<uuid>`) and the product UUID an attestor proved, so that
    // one machine never becomes two live nodes; each join keeps the product
    // UUID it claimed (a provisioned token's target is read from it).
    r#"
    ALTER TABLE join_tokens ADD COLUMN target_node_id TEXT;
    ALTER TABLE join_tokens ADD COLUMN allow_reclaim INTEGER NOT NULL DEFAULT 0 CHECK (allow_reclaim IN (0, 1));
    ALTER TABLE nodes ADD COLUMN hardware_key TEXT;
    ALTER TABLE nodes ADD COLUMN product_uuid TEXT;
    CREATE INDEX nodes_by_hardware_key ON nodes(hardware_key) WHERE hardware_key IS NOT NULL;
    CREATE INDEX nodes_by_product_uuid ON nodes(product_uuid) WHERE product_uuid IS NOT NULL;
    ALTER TABLE joins ADD COLUMN product_uuid TEXT;
    -- Nodes that joined before: a TPM-bound node's key is its EK.
    UPDATE nodes SET hardware_key = 'tpm-ek:' || (
        SELECT key FROM node_bindings b WHERE b.node_id = nodes.id AND b.kind = 'tpm-ek')
    WHERE deleted_at IS NULL
      AND EXISTS (SELECT 1 FROM node_bindings b WHERE b.node_id = nodes.id AND b.kind = 'tpm-ek');
    "#,
    // 9: cloud-iid's resolve table: where a VM of a provider account (and
    // zone; '' is any zone) joins. A VM of an account not listed is refused.
    r#"
    CREATE TABLE cloud_resolve (
        provider   TEXT NOT NULL,
        account    TEXT NOT NULL,
        zone       TEXT NOT NULL,
        pool_id    TEXT,
        created_at INTEGER NOT NULL,
        PRIMARY KEY (provider, account, zone)
    ) STRICT;
    "#,
    // 10: the site a TPM joins as a site node of: a resolve entry's or an
    // approved join request's (NULL: a plain node).
    r#"
    ALTER TABLE tpm_resolve ADD COLUMN site_id TEXT;
    ALTER TABLE join_requests ADD COLUMN site_id TEXT;
    "#,
    // 11: a boot entry's discovery tokens: one per boot script (each single
    // use), so that the entry is spent by a join, not by a request. The
    // entry's own token (boot_entries.token_id) is the first.
    r#"
    CREATE TABLE boot_tokens (
        token_id    TEXT PRIMARY KEY REFERENCES join_tokens(id),
        workflow_id TEXT NOT NULL REFERENCES boot_entries(workflow_id),
        created_at  INTEGER NOT NULL
    ) STRICT;
    CREATE INDEX boot_tokens_by_workflow ON boot_tokens(workflow_id);
    INSERT INTO boot_tokens (token_id, workflow_id, created_at)
        SELECT token_id, workflow_id, created_at FROM boot_entries;
    CREATE INDEX boot_entries_by_node ON boot_entries(node_id) WHERE node_id IS NOT NULL;
    -- Claimed UUIDs were kept as trusted ones before: a TPM join's SMBIOS
    -- UUID, a ramdisk's asserted (iPXE's) UUID, and placeholders. Only the EK
    -- of a TPM node stays its key.
    UPDATE nodes SET product_uuid = NULL WHERE hardware_key LIKE 'tpm-ek:%';
    UPDATE nodes SET hardware_key = NULL, product_uuid = NULL WHERE role = 'ramdisk';
    UPDATE nodes SET hardware_key = NULL, product_uuid = NULL
     WHERE product_uuid IN ('00000000-0000-0000-0000-000000000000',
                            'ffffffff-ffff-ffff-ffff-ffffffffffff',
                            '03000200-0400-0500-0006-000700080009',
                            '00020003-0004-0005-0006-000700080009',
                            '12345678-1234-5678-90ab-cddeefaabbcc');
    "#,
    // 12: the roles a cloud resolve row admits beyond `[cloud_iid] roles`
    // (`cloud resolve add --role`): role names separated by ',' (NULL: none).
    r#"
    ALTER TABLE cloud_resolve ADD COLUMN roles TEXT;
    "#,
    // 13: what a configured EK CA is for: `anchor` (every certificate
    // `ek-roots add` adds, self-signed or not) or `intermediate` (`ek-roots
    // add --intermediate`). Rows added before (NULL) keep their meaning: an
    // anchor when self-signed, else an intermediate.
    r#"
    ALTER TABLE ek_roots ADD COLUMN kind TEXT CHECK (kind IS NULL OR kind IN ('anchor', 'intermediate'));
    "#,
    // 14: a resolve entry may pin an EK that has no EK certificate
    // (`resolve add --uncertified`, the spec's allowUncertifiedEk).
    r#"
    ALTER TABLE tpm_resolve ADD COLUMN uncertified INTEGER NOT NULL DEFAULT 0 CHECK (uncertified IN (0, 1));
    "#,
    // 15: where a tpm join's EK certificate came from (the EK assurance:
    // nv, nv-chain, operator-file, maker-service, pinned); NULL for joins
    // that proved no EK.
    r#"
    ALTER TABLE joins ADD COLUMN ek_assurance TEXT;
    "#,
    // 16: discovery joins waiting for an operator (`[discovery] approval =
    // "unknown-machines"`) are join requests too, so `requests list|approve|
    // deny` decide both. Such a request names the boot entry (workflow), the
    // MAC and UUID the join was for, its source address, and what it proved:
    // the EK when the ramdisk proved its TPM, else only its node key (the
    // CSR's key), so `ek_sha256` becomes nullable (the table is rebuilt:
    // SQLite cannot drop a NOT NULL). The tpm attestor's one open request
    // per EK stays; a discovery request is open once per entry and evidence.
    r#"
    CREATE TABLE join_requests_16 (
        id              TEXT PRIMARY KEY,
        attestor        TEXT NOT NULL,
        ek_sha256       TEXT,
        ek_issuer       TEXT NOT NULL DEFAULT '',
        ek_serial       TEXT NOT NULL DEFAULT '',
        status          TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'denied')),
        pool_id         TEXT,
        created_at      INTEGER NOT NULL,
        decided_at      INTEGER,
        used_at         INTEGER,
        site_id         TEXT,
        workflow_id     TEXT,
        mac             TEXT,
        product_uuid    TEXT,
        source          TEXT,
        node_key_sha256 TEXT,
        CHECK (ek_sha256 IS NOT NULL OR (attestor = 'discovery' AND node_key_sha256 IS NOT NULL))
    ) STRICT;
    INSERT INTO join_requests_16 (id, attestor, ek_sha256, ek_issuer, ek_serial, status, pool_id,
                                  created_at, decided_at, used_at, site_id)
        SELECT id, attestor, ek_sha256, ek_issuer, ek_serial, status, pool_id,
               created_at, decided_at, used_at, site_id FROM join_requests;
    DROP TABLE join_requests;
    ALTER TABLE join_requests_16 RENAME TO join_requests;
    CREATE UNIQUE INDEX join_requests_open ON join_requests(ek_sha256)
        WHERE used_at IS NULL AND attestor <> 'discovery';
    CREATE UNIQUE INDEX join_requests_open_boot
        ON join_requests(coalesce(workflow_id, ''), coalesce('ek:' || ek_sha256, 'key:' || node_key_sha256))
        WHERE used_at IS NULL AND attestor = 'discovery';
    "#,
    // 17: EK certificates fetched from a maker's service ([tpm.ek_services]),
    // by the SHA-256 of the EK's SPKI (the certificate's key is the EK's):
    // each machine's is fetched once, and verified at every join.
    r#"
    CREATE TABLE ek_service_certificates (
        ek_sha256 TEXT PRIMARY KEY,
        service TEXT NOT NULL,
        url TEXT NOT NULL,
        certificate BLOB NOT NULL,
        fetched_at INTEGER NOT NULL
    );
    "#,
    // 18: the EK a boot entry expects (`boot add --ek-sha256`, or `--node`'s
    // bound EK): only a discovery join proving it answers for the entry.
    // NULL: any machine on the boot LAN may (the entry's other bindings
    // still hold).
    r#"
    ALTER TABLE boot_entries ADD COLUMN ek_sha256 TEXT CHECK (ek_sha256 IS NULL OR length(ek_sha256) = 64);
    "#,
    // 19: a discovery request names the token and the signed assertion it
    // came with (its single-use key, and when that use would expire): one
    // open request per token and per assertion, so that one script (a
    // neighbour's fetch of the victim's) files one request however many
    // node keys join with it, and a denial revokes that token and spends
    // that assertion (a join with it is then refused `approval-denied`).
    // `source` is indexed for the per-source count.
    r#"
    ALTER TABLE join_requests ADD COLUMN token_id TEXT;
    ALTER TABLE join_requests ADD COLUMN assertion_sha256 TEXT;
    ALTER TABLE join_requests ADD COLUMN assertion_expires_at INTEGER;
    CREATE UNIQUE INDEX join_requests_open_token ON join_requests(token_id)
        WHERE used_at IS NULL AND attestor = 'discovery' AND status <> 'denied';
    CREATE UNIQUE INDEX join_requests_open_assertion ON join_requests(assertion_sha256)
        WHERE used_at IS NULL AND attestor = 'discovery' AND status <> 'denied';
    CREATE INDEX join_requests_pending_source ON join_requests(workflow_id, source)
        WHERE status = 'pending' AND attestor = 'discovery';
    CREATE INDEX join_requests_denied_assertion ON join_requests(assertion_sha256)
        WHERE status = 'denied' AND attestor = 'discovery';
    "#,
    // 20: the command channel (docs/commands.md). A command is signed once
    // and its signed bytes delivered every time; its state is `queued`
    // until a verified result (the result's status) or its not_after passes
    // (`expired`, by database time). `result_checked` says the result's
    // signature verified with the key of the certificate the channel was
    // proven with (a result is stored only then; 0 is never written, the
    // column is what `commands show` prints). Inventories are
    // inventory.refresh results, newest last per node, flagged where they
    // differ from what the node showed at join; the joins audit keeps the
    // MACs each join claimed, to compare against.
    r#"
    CREATE TABLE commands (
        id             TEXT PRIMARY KEY,
        node_id        TEXT NOT NULL REFERENCES nodes(id),
        kind           TEXT NOT NULL,
        args           TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(args)),
        signed         BLOB NOT NULL,
        state          TEXT NOT NULL CHECK (state IN ('queued', 'ok', 'failed', 'refused', 'expired')),
        queued_at      INTEGER NOT NULL,
        not_after      INTEGER NOT NULL,
        finished_at    INTEGER,
        result         BLOB,
        result_status  TEXT,
        outcome        TEXT,
        output_sha256  TEXT,
        result_checked INTEGER CHECK (result_checked IS NULL OR result_checked IN (0, 1)),
        result_serial  TEXT
    ) STRICT;
    CREATE INDEX commands_queued ON commands(node_id, not_after) WHERE state = 'queued';
    CREATE INDEX commands_by_node ON commands(node_id, queued_at);

    CREATE TABLE inventories (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        node_id     TEXT NOT NULL REFERENCES nodes(id),
        command_id  TEXT NOT NULL,
        at          INTEGER NOT NULL,
        inventory   TEXT NOT NULL CHECK (json_valid(inventory)),
        flags       TEXT NOT NULL DEFAULT '[]' CHECK (json_valid(flags))
    ) STRICT;
    CREATE INDEX inventories_by_node ON inventories(node_id, id);

    ALTER TABLE joins ADD COLUMN macs TEXT;
    "#,
    // 21: deploy images and NoCloud seeds (docs/deploy.md). An image's row
    // names its stored file by the stored bytes' SHA-256 and pins the raw
    // image's digest and size, which `deploy.image` carries. A node's seed
    // (the user data with its provisioned token) is sealed under the boot
    // key, one per node, served to that node's ramdisk until not_after.
    r#"
    CREATE TABLE images (
        name          TEXT PRIMARY KEY,
        sha256        TEXT NOT NULL CHECK (length(sha256) = 64),
        bytes         INTEGER NOT NULL CHECK (bytes > 0),
        compression   TEXT NOT NULL CHECK (compression IN ('none', 'zstd')),
        stored_bytes  INTEGER NOT NULL CHECK (stored_bytes > 0),
        stored_sha256 TEXT NOT NULL CHECK (length(stored_sha256) = 64),
        created_at    INTEGER NOT NULL
    ) STRICT;

    CREATE TABLE deploy_seeds (
        node_id    TEXT PRIMARY KEY REFERENCES nodes(id),
        sealed     BLOB NOT NULL,
        sha256     TEXT NOT NULL CHECK (length(sha256) = 64),
        not_after  INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    ) STRICT;
    "#,
    // 22: workflows (docs/workflows.md): one row per commission or deploy,
    // its id the boot entry's (`wf_…`), advanced one step at a time by the
    // control plane's poller; `version` is bumped by every write (optimistic
    // concurrency beside PostgreSQL's row lock). `install_script` is the
    // script the deploy's user data runs (no secret); `token_id` the
    // provisioned token userdata.render minted (its secret is never stored
    // here). Steps are numbered from 0 in the order they run.
    r#"
    CREATE TABLE workflows (
        id             TEXT PRIMARY KEY,
        kind           TEXT NOT NULL CHECK (kind IN ('commission', 'deploy')),
        site_id        TEXT NOT NULL,
        node_id        TEXT,
        mac            TEXT NOT NULL,
        product_uuid   TEXT,
        ek_sha256      TEXT,
        image          TEXT,
        disk           TEXT,
        wipe           INTEGER NOT NULL DEFAULT 0 CHECK (wipe IN (0, 1)),
        user_data      TEXT,
        install_script TEXT,
        state          TEXT NOT NULL CHECK (state IN ('running', 'succeeded', 'failed', 'cancelled')),
        step           INTEGER NOT NULL DEFAULT 0,
        failure        TEXT,
        token_id       TEXT,
        created_at     INTEGER NOT NULL,
        updated_at     INTEGER NOT NULL,
        finished_at    INTEGER,
        version        INTEGER NOT NULL DEFAULT 1
    ) STRICT;
    CREATE INDEX workflows_running ON workflows(created_at) WHERE state = 'running';
    CREATE INDEX workflows_by_node ON workflows(node_id, created_at);

    CREATE TABLE workflow_steps (
        workflow_id  TEXT NOT NULL REFERENCES workflows(id),
        seq          INTEGER NOT NULL,
        name         TEXT NOT NULL,
        state        TEXT NOT NULL CHECK (state IN ('pending', 'running', 'done', 'failed', 'skipped')),
        started_at   INTEGER,
        finished_at  INTEGER,
        command_id   TEXT,
        detail       TEXT,
        PRIMARY KEY (workflow_id, seq)
    ) STRICT;
    "#,
    // 23: a pool's boot policy (issue 31): the TOML its operator gave,
    // dbx_min files resolved into their entries, re-parsed on read
    // (model/boot_policy.rs). NULL: no boot policy.
    r#"
    ALTER TABLE pools ADD COLUMN boot_policy TEXT;
    "#,
    // 24: each node's last verified boot (issue 31), written when a join or
    // a renewal met its pool's boot policy (model/node_boot.rs): Secure
    // Boot's state, the boot applications (digest and authorities, JSON),
    // the kernel command line, and when and by which call.
    r#"
    CREATE TABLE node_boots (
        node_id      TEXT PRIMARY KEY,
        verified_at  INTEGER NOT NULL,
        via          TEXT NOT NULL CHECK (via IN ('join', 'renew')),
        secure_boot  TEXT NOT NULL,
        boot_apps    TEXT NOT NULL CHECK (json_valid(boot_apps)),
        cmdline      TEXT
    ) STRICT;
    "#,
    // 25: tenants (issue 33). A tenant owns pools (`pools.owner` names
    // one): `root` and every owner a pool already names, so that today's
    // setups keep working. Each event names the tenant it is attributed to
    // (docs/control-plane.md, "Tenants"): NULL is the operator's. Events
    // written before are attributed by their node's pool (a join refusal
    // names an unverified node, so it stays the operator's).
    r#"
    CREATE TABLE tenants (
        id         TEXT PRIMARY KEY,
        created_at INTEGER NOT NULL
    ) STRICT;
    INSERT INTO tenants (id, created_at)
        VALUES ('root', CAST(strftime('%s', 'now') AS INTEGER) * 1000);
    INSERT INTO tenants (id, created_at)
        SELECT DISTINCT owner, CAST(strftime('%s', 'now') AS INTEGER) * 1000
        FROM pools WHERE owner <> 'root';
    ALTER TABLE events ADD COLUMN tenant_id TEXT;
    UPDATE events SET tenant_id = (
        SELECT p.owner FROM nodes n JOIN pools p ON p.id = n.pool_id WHERE n.id = events.node_id)
    WHERE node_id IS NOT NULL AND type <> 'security.join.refused';
    CREATE INDEX events_by_tenant ON events(tenant_id, id) WHERE tenant_id IS NOT NULL;
    "#,
    // 26: node leases (issue 33): a node lent to a tenant (the lessee)
    // from `created_at` until `ended_at` (`leases end`) or `until_at`
    // (database time), whichever comes first. While one is active, every
    // certificate issued to the node names the lessee and runs only
    // `allowed_kinds` (a JSON array of patterns, fixed when the lease was
    // made). At most one open lease per node. (`leases` is the site boot
    // lease of migration 7; `until` would be a keyword in PostgreSQL.)
    r#"
    CREATE TABLE node_leases (
        id            TEXT PRIMARY KEY,
        node_id       TEXT NOT NULL REFERENCES nodes(id),
        tenant_id     TEXT NOT NULL REFERENCES tenants(id),
        allowed_kinds TEXT NOT NULL CHECK (json_valid(allowed_kinds)),
        created_at    INTEGER NOT NULL,
        until_at      INTEGER,
        ended_at      INTEGER
    ) STRICT;
    CREATE UNIQUE INDEX node_leases_open ON node_leases(node_id) WHERE ended_at IS NULL;
    CREATE INDEX node_leases_by_tenant ON node_leases(tenant_id, created_at);
    "#,
    // 27: cloud-iid resolve rules that decide where a VM joins (issue 33):
    // a row's site (`site_id`, or `site_from` = 'zone': the site the VM's
    // zone names), and known instances that join as their node.
    r#"
    ALTER TABLE cloud_resolve ADD COLUMN site_id TEXT;
    ALTER TABLE cloud_resolve ADD COLUMN site_from TEXT CHECK (site_from IN ('zone'));
    CREATE TABLE cloud_instances (
        provider    TEXT NOT NULL,
        account     TEXT NOT NULL,
        instance    TEXT NOT NULL,
        node_id     TEXT NOT NULL,
        created_at  INTEGER NOT NULL,
        PRIMARY KEY (provider, account, instance)
    ) STRICT;
    "#,
];

/// How many of [`MIGRATIONS`] a database at schema `version` has applied;
/// a version this build does not know (a newer bc-controlplane migrated it)
/// is `too_new`, on either backend.
pub(super) fn applied(
    version: i64,
    too_new: impl FnOnce(usize) -> super::DbError,
) -> Result<usize, super::DbError> {
    let applied = usize::try_from(version).map_err(|_| super::DbError::Corrupt {
        what: "schema version",
        detail: version.to_string(),
    })?;
    if applied > MIGRATIONS.len() {
        return Err(too_new(MIGRATIONS.len()));
    }
    Ok(applied)
}
