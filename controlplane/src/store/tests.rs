use super::*;
use crate::test_support::{both_backends, old_db_on, temp_db_on, Backend};

both_backends!(
    migrates_once_and_moves_the_clock,
    values_round_trip_and_type_mismatches_name_the_column,
    write_if_commits_only_when_told,
    execute_counts_changed_rows,
    migration_8_backfills_tpm_hardware_keys,
    migration_16_keeps_enrollment_requests_and_admits_discovery_ones,
    migration_25_makes_every_pool_owner_a_tenant_and_attributes_node_events,
    read_refuses_writes,
);

/// A write inside `read` fails on either backend (SQLite's read
/// connections are `query_only`, PostgreSQL's reads READ ONLY), as
/// [`DbError::WriteInRead`] naming the statement, and writes nothing; the
/// connection serves the next read.
fn read_refuses_writes(backend: Backend) {
    let t = temp_db_on(backend);
    t.db.write(|tx| {
        tx.execute(
            "INSERT INTO settings (key, value) VALUES ('k', 'v')",
            params![],
        )
    })
    .unwrap();
    for sql in [
        "INSERT INTO settings (key, value) VALUES ('k2', 'v')",
        "UPDATE settings   SET value = 'w'\n   WHERE key = 'k'",
        "DELETE FROM settings WHERE key = 'k'",
    ] {
        let e = t.db.read(|tx| tx.execute(sql, params![])).unwrap_err();
        let folded = sql.split_whitespace().collect::<Vec<_>>().join(" ");
        match &e {
            DbError::WriteInRead { sql } => assert_eq!(sql, &folded),
            other => panic!("{sql}: {other:?}"),
        }
        assert!(e.to_string().contains("Store::write"), "{e}");
        // A closure that reads first and then writes fails the same way.
        let e =
            t.db.read(|tx| {
                tx.now()?;
                tx.execute(sql, params![])
            })
            .unwrap_err();
        assert!(matches!(e, DbError::WriteInRead { .. }), "{e:?}");
    }
    let rows: Vec<(String, String)> =
        t.db.read(|tx| {
            tx.query_map("SELECT key, value FROM settings", params![], |r| {
                Ok((r.get(0)?, r.get(1)?))
            })?
            .collect()
        })
        .unwrap();
    assert_eq!(rows, [("k".to_owned(), "v".to_owned())]);
}

fn migrates_once_and_moves_the_clock(backend: Backend) {
    let t = temp_db_on(backend);
    let db = &t.db;
    // Opening again is a no-op migration.
    let db2 = t.reopen();
    let version_sql = match backend {
        Backend::Sqlite => "PRAGMA user_version",
        Backend::Postgres => "SELECT version FROM bcd_schema",
    };
    let v: i64 = db2
        .read(|tx| tx.query_one(version_sql, params![])?.get(0))
        .unwrap();
    assert_eq!(v, MIGRATIONS.len() as i64);

    let before = db.read(|tx| tx.now()).unwrap();
    db.write(|tx| set_clock_offset_ms(tx, 3_600_000)).unwrap();
    let after = db2.read(|tx| tx.now()).unwrap();
    assert!(after - before >= 3_600_000);
    assert!(after - before < 3_660_000);
}

/// Values go in and come out as they were; a column read as another type
/// is an error naming its index, not a panic or a silent conversion.
fn values_round_trip_and_type_mismatches_name_the_column(backend: Backend) {
    let t = temp_db_on(backend);
    // PG infers an untyped `$N` in a select list as text: the casts say
    // what each is (SQLite would take BYTEA as a numeric affinity).
    let sql = match backend {
        Backend::Sqlite => "SELECT ?1, ?2, ?3, ?4, ?5, ?6",
        Backend::Postgres => {
            "SELECT CAST(?1 AS BIGINT), CAST(?2 AS TEXT), CAST(?3 AS BYTEA), CAST(?4 AS TEXT),
                    CAST(?5 AS BIGINT), CAST(?6 AS TEXT)"
        }
    };
    let row =
        t.db.read(|tx| {
            tx.query_one(
                sql,
                params![7_i64, "seven", vec![7_u8], None::<String>, true, Some("x")],
            )
        })
        .unwrap();
    assert_eq!(row.get::<i64>(0).unwrap(), 7);
    assert_eq!(row.get::<String>(1).unwrap(), "seven");
    assert_eq!(row.get::<Vec<u8>>(2).unwrap(), vec![7]);
    assert_eq!(row.get::<Option<String>>(3).unwrap(), None);
    assert!(row.get::<bool>(4).unwrap());
    assert_eq!(row.get::<Option<String>>(5).unwrap().as_deref(), Some("x"));
    match row.get::<i64>(1) {
        Err(DbError::Column {
            index: 1,
            expected: "integer",
            found: "text",
        }) => {}
        other => panic!("{other:?}"),
    }
    let e = row.get::<String>(3).unwrap_err().to_string();
    assert!(e.contains("column 3") && e.contains("null"), "{e}");
    assert!(matches!(
        row.get::<i64>(9),
        Err(DbError::Column { index: 9, .. })
    ));
    assert_eq!(
        Value::from(Some(3_i64)),
        Value::Int(3),
        "From<Option<_>> binds the value"
    );
    assert_eq!(Value::from(None::<&str>), Value::Null);
    assert_eq!(Value::from(&b"ab"[..]), Value::Blob(b"ab".to_vec()));
}

/// `execute` returns how many rows a statement changed.
fn execute_counts_changed_rows(backend: Backend) {
    let t = temp_db_on(backend);
    let n =
        t.db.write(|tx| {
            tx.execute(
                "INSERT INTO settings (key, value) VALUES ('a', '1'), ('b', '2'), ('c', '3')",
                params![],
            )?;
            tx.execute(
                "UPDATE settings SET value = ?1 WHERE key <> ?2",
                params!["x", "a"],
            )
        })
        .unwrap();
    assert_eq!(n, 2);
}

/// `write_if` commits only when told; `write` rolls back on `Err`.
fn write_if_commits_only_when_told(backend: Backend) {
    let t = temp_db_on(backend);
    let put = |tx: &Tx<'_>, k: &str| {
        tx.execute(
            "INSERT INTO settings (key, value) VALUES (?1, 'v')",
            params![k],
        )
    };
    t.db.write_if(|tx| put(tx, "kept").map(|_| ((), Commit::Yes)))
        .unwrap();
    t.db.write_if(|tx| put(tx, "dropped").map(|_| ((), Commit::No)))
        .unwrap();
    let failed: Result<(), DbError> = t.db.write(|tx| {
        put(tx, "failed")?;
        Err(DbError::Busy)
    });
    assert!(failed.is_err());
    let keys: Vec<String> =
        t.db.read(|tx| {
            tx.query("SELECT key FROM settings ORDER BY key", params![])?
                .iter()
                .map(|r| r.get(0))
                .collect()
        })
        .unwrap();
    assert_eq!(keys, ["kept"]);
}

/// Migration 8 gives a node bound to an EK before it that EK as its
/// hardware key, so an upgrade does not let its machine join twice.
fn migration_8_backfills_tpm_hardware_keys(backend: Backend) {
    let t = old_db_on(
        backend,
        7,
        "INSERT INTO nodes (id, role, identity_generation, attestor, joined_at)
             VALUES ('node_a', 'node', 1, 'tpm', 1), ('node_b', 'node', 1, 'join-token', 1);
         INSERT INTO node_bindings (kind, key, node_id, created_at)
             VALUES ('tpm-ek', 'ab12', 'node_a', 1);",
    );
    let keys = crate::model::hardware::keys(&t.db).unwrap();
    assert_eq!(keys.len(), 1);
    assert_eq!(keys["node_a"], "tpm-ek:ab12");
}

/// Migration 11 keeps only attested or operator-bound hardware keys:
/// a TPM node's claimed UUID, a ramdisk's asserted one and placeholders
/// go; an EK and a bound UUID stay. Boot entries' tokens are linked.
#[test]
fn migration_11_drops_claimed_hardware_keys() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("old.db");
    sqlite::old_database(
        &path,
        10,
        "INSERT INTO nodes (id, role, identity_generation, attestor, joined_at,
                            hardware_key, product_uuid) VALUES
           ('node_tpm', 'node', 1, 'tpm', 1, 'tpm-ek:ab12',
            '03000200-0400-0500-0006-000700080009'),
           ('node_ram', 'ramdisk', 1, 'discovery', 1,
            'product-uuid:4c4c4544-0042-3510-8052-b4c04f4e4d32',
            '4c4c4544-0042-3510-8052-b4c04f4e4d32'),
           ('node_zero', 'node', 1, 'join-token', 1,
            'product-uuid:00000000-0000-0000-0000-000000000000',
            '00000000-0000-0000-0000-000000000000'),
           ('node_bound', 'node', 1, 'join-token', 1,
            'product-uuid:4c4c4544-0042-3510-8052-b4c04f4e4d32',
            '4c4c4544-0042-3510-8052-b4c04f4e4d32');
         INSERT INTO sites (id, name, created_at) VALUES ('site_1', 'dc1', 1);
         INSERT INTO join_tokens (id, secret_sha256, role, uses_left, expires_at, created_at)
             VALUES ('tok_1', zeroblob(32), 'discovery', 1, 9, 1);
         INSERT INTO boot_entries (workflow_id, site_id, mac, token_id, sealed_secret,
                                   not_after, created_at)
             VALUES ('wf_1', 'site_1', '52:54:00:12:34:56', 'tok_1', x'00', 9, 1);",
    );
    let db = Store::open(&path).unwrap();
    let keys = crate::model::hardware::keys(&db).unwrap();
    assert_eq!(keys.len(), 2, "{keys:?}");
    assert_eq!(keys["node_tpm"], "tpm-ek:ab12");
    assert!(keys["node_bound"].starts_with("product-uuid:4c4c4544"));
    let linked: String = db
        .read(|tx| {
            tx.query_one(
                "SELECT workflow_id FROM boot_tokens WHERE token_id = 'tok_1'",
                params![],
            )?
            .get(0)
        })
        .unwrap();
    assert_eq!(linked, "wf_1");
}

/// Migration 16 keeps every enrollment request as it was, and lets a
/// discovery request carry no EK; one open request per EK (tpm) and
/// per entry and evidence (discovery).
fn migration_16_keeps_enrollment_requests_and_admits_discovery_ones(backend: Backend) {
    let t = old_db_on(
        backend,
        15,
        "INSERT INTO join_requests (id, attestor, ek_sha256, ek_issuer, ek_serial, status,
                                    created_at, site_id)
             VALUES ('req_1', 'tpm', 'ab12', 'CN=x', '01', 'pending', 5, 'site_1');",
    );
    let db = &t.db;
    let rows = crate::model::enroll::list_requests(db).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].ek_sha256.as_deref(), Some("ab12"));
    assert_eq!(rows[0].site_id.as_deref(), Some("site_1"));
    assert_eq!(rows[0].created_at, 5);
    let insert = |id: &str, attestor: &str, ek: Option<&str>, key: Option<&str>| {
        db.write(|tx| {
            tx.execute(
                "INSERT INTO join_requests (id, attestor, ek_sha256, status, created_at,
                                            workflow_id, node_key_sha256)
                 VALUES (?1, ?2, ?3, 'pending', 6, 'wf_1', ?4)",
                params![id, attestor, ek, key],
            )
        })
    };
    assert!(
        insert("req_2", "tpm", Some("ab12"), None).is_err(),
        "one open per EK"
    );
    assert!(
        insert("req_3", "tpm", None, None).is_err(),
        "a tpm request has an EK"
    );
    assert!(
        insert("req_4", "discovery", None, None).is_err(),
        "or a node key"
    );
    insert("req_5", "discovery", None, Some("k1")).unwrap();
    insert("req_6", "discovery", None, Some("k2")).unwrap();
    assert!(insert("req_7", "discovery", None, Some("k1")).is_err());
    // A discovery request proving the EK of a pending enrollment.
    insert("req_8", "discovery", Some("ab12"), Some("k3")).unwrap();
}

/// Migration 25: `root` and every owner a pool named are tenants (so their
/// pools keep working), and the events of a node are its pool owner's; a
/// join refusal (an unverified node id) and an event naming no node stay
/// the operator's.
fn migration_25_makes_every_pool_owner_a_tenant_and_attributes_node_events(backend: Backend) {
    let t = old_db_on(
        backend,
        24,
        "INSERT INTO pools (id, owner, created_at) VALUES ('metal', 'alice', 1), ('gpu', 'alice', 1);
         INSERT INTO nodes (id, role, identity_generation, attestor, joined_at, pool_id)
             VALUES ('node_a', 'node', 1, 'join-token', 1, 'metal'),
                    ('node_b', 'node', 1, 'join-token', 1, 'default');
         INSERT INTO events (type, at, node_id) VALUES
             ('node.joined', 1, 'node_a'), ('node.joined', 2, 'node_b'),
             ('security.join.refused', 3, 'node_a'), ('node.renewed', 4, NULL);",
    );
    let mut tenants: Vec<String> = crate::model::tenants::list(&t.db)
        .unwrap()
        .into_iter()
        .map(|t| t.id)
        .collect();
    tenants.sort();
    assert_eq!(tenants, ["alice", "root"]);
    let attributed: Vec<Option<String>> = crate::model::records::list_events(&t.db)
        .unwrap()
        .into_iter()
        .map(|e| e.tenant_id)
        .collect();
    assert_eq!(
        attributed,
        [
            Some("alice".to_owned()),
            Some("root".to_owned()),
            None,
            None
        ]
    );
    let alice = crate::model::records::list_events_of(&t.db, Some("alice")).unwrap();
    assert_eq!(alice.len(), 1);
}

#[test]
fn rfc3339_format() {
    assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
    assert_eq!(rfc3339(1_700_000_000_123), "2023-11-14T22:13:20.123Z");
}

/// The drivers' paths only in their backends (store/sqlite.rs; store/pg.rs
/// and its schema runner): every other module goes through [`Tx`].
#[test]
fn the_driver_is_named_only_in_the_sqlite_backend() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut strays = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let sqlite_ok = path.ends_with("store/sqlite.rs");
            let pg_ok = path.ends_with("store/pg.rs") || path.ends_with("store/pg_schema.rs");
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                if (!sqlite_ok && line.contains(concat!("rusqlite", "::")))
                    || (!pg_ok && line.contains(concat!("postgres", "::")))
                {
                    strays.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
                }
            }
        }
    }
    assert!(
        strays.is_empty(),
        "a driver outside its backend (use store::Tx):\n{}",
        strays.join("\n")
    );
}
