//! Every refusal reason the control plane can give has an e2e test that
//! sees ACCESS_DENIED at the agent and the reason at the server: this table
//! names it, and the test below fails the build when a reason of
//! [`bc_controlplane::reasons::PLACES`] (derived from each place's reason
//! enum, so complete) has no row, when a named test does not exist or does not
//! mention its reason, and when `tests/e2e/reasons.md` (the table for
//! readers) is not what this table says.

use std::collections::BTreeSet;

use crate::harness::workspace;

/// (place, reason, the e2e test that sees it: `module::fn`).
const TESTED: &[(&str, &str, &str)] = &[
    (
        "join",
        "join:csr-key",
        "refusals::a_join_whose_csr_key_is_not_p256_is_refused",
    ),
    (
        "join",
        "reclaim",
        "reclaim::a_known_machine_is_refused_unless_the_token_allows_a_reclaim",
    ),
    (
        "join",
        "join:reclaim-unknown-node",
        "reclaim::a_reclaim_of_a_deleted_retired_or_other_role_node_is_refused",
    ),
    (
        "join",
        "join:reclaim-retired",
        "reclaim::a_reclaim_of_a_deleted_retired_or_other_role_node_is_refused",
    ),
    (
        "join",
        "join:reclaim-role",
        "reclaim::a_reclaim_of_a_deleted_retired_or_other_role_node_is_refused",
    ),
    (
        "join",
        "bound-elsewhere",
        "tpm::another_tpm_cannot_join_as_the_first_ones_node",
    ),
    (
        "join",
        "join:pool-attestor",
        "tpm::a_pool_that_requires_tpm_refuses_a_token_join",
    ),
    (
        "join",
        "join:pool-ek-assurance",
        "eksource::the_ek_assurance_is_recorded_and_a_pool_may_require_a_minimum",
    ),
    (
        "join",
        "join:expect-product-uuid",
        "join_token::other_machines_are_refused_and_spend_no_use",
    ),
    (
        "join",
        "join:expect-mac",
        "join_token::other_machines_are_refused_and_spend_no_use",
    ),
    (
        "join-token",
        "token-unknown",
        "join_token::unknown_token_is_refused",
    ),
    (
        "join-token",
        "token-secret",
        "join_token::wrong_secret_is_refused",
    ),
    (
        "join-token",
        "token-revoked",
        "join_token::revoked_token_is_refused",
    ),
    (
        "join-token",
        "token-expired",
        "join_token::expired_token_is_refused_at_database_time",
    ),
    (
        "join-token",
        "token-exhausted",
        "join_token::used_up_token_is_refused",
    ),
    (
        "join-token",
        "token-role",
        "join_token::a_token_admits_only_its_role",
    ),
    (
        "provisioned",
        "token-role",
        "provisioned::provisioned_refusals",
    ),
    (
        "provisioned",
        "token-exhausted",
        "provisioned::a_provisioned_token_joins_its_machine_once_as_a_new_node",
    ),
    (
        "provisioned",
        "not-single-use",
        "provisioned::provisioned_refusals",
    ),
    (
        "provisioned",
        "no-product-uuid",
        "provisioned::provisioned_refusals",
    ),
    (
        "provisioned",
        "unbound",
        "provisioned::provisioned_refusals",
    ),
    (
        "provisioned",
        "product-uuid-mismatch",
        "provisioned::provisioned_refusals",
    ),
    (
        "discovery",
        "discovery-role",
        "discovery::only_single_use_tokens_and_ramdisks_are_admitted",
    ),
    (
        "discovery",
        "assertion-malformed",
        "discovery::a_malformed_assertion_is_refused_by_name",
    ),
    (
        "discovery",
        "assertion-reused",
        "discovery::a_ramdisk_joins_once_with_its_site_nodes_assertion",
    ),
    (
        "discovery",
        "token-role",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "token-exhausted",
        "discovery::a_ramdisk_joins_once_with_its_site_nodes_assertion",
    ),
    (
        "discovery",
        "token-not-single-use",
        "discovery::only_single_use_tokens_and_ramdisks_are_admitted",
    ),
    (
        "discovery",
        "token-site",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "token-mac",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "signer-unknown",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "signer-retired",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "signer-not-site",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "lease-not-held",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "lease-epoch",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "signer-certificate",
        "discovery::an_expired_signer_certificate_vouches_for_nobody",
    ),
    (
        "discovery",
        "assertion-signature",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "assertion-stale",
        "discovery::assertions_are_stale_after_the_configured_max_age",
    ),
    (
        "discovery",
        "assertion-future",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "mac-not-claimed",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "product-uuid-mismatch",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "boot-ek-missing",
        "discovery_tpm::an_entry_that_expects_an_ek_admits_only_that_tpm",
    ),
    (
        "discovery",
        "boot-ek-mismatch",
        "discovery_tpm::an_entry_for_a_known_node_admits_only_its_tpm",
    ),
    (
        "discovery",
        "approval-denied",
        "approval::a_neighbours_join_waits_for_the_operator_who_denies_it_and_approves_the_machine",
    ),
    (
        "discovery",
        "approval-busy",
        "approval::an_approval_flood_from_one_script_leaves_the_victim_heard_and_one_deny_ends_it",
    ),
    (
        "tpm",
        "tpm-role",
        "site::a_tpm_joined_site_node_serves_and_vouches",
    ),
    (
        "tpm",
        "ek-certificate",
        "realek::an_intermediate_is_no_anchor_and_a_ca_is_no_ek",
    ),
    (
        "tpm",
        "ek-chain",
        "ekchain::the_intermediate_nowhere_is_refused_ek_chain",
    ),
    (
        "tpm",
        "ek-mismatch",
        "ektemplate::identify_says_when_the_tpms_ek_is_not_its_certificates",
    ),
    (
        "tpm",
        "challenge-reused",
        "replay::a_replayed_tpm_answer_is_refused_and_the_node_keeps_renewing",
    ),
    (
        "tpm",
        "challenge-secret",
        "tpm::a_wrong_credential_is_refused",
    ),
    ("tpm", "quote-pcrs", "tpm::pcr_values_must_match_the_quote"),
    (
        "tpm",
        "pcr-policy",
        "pcr::a_pcr_that_does_not_meet_the_policy_is_refused",
    ),
    ("tpm", "node-key-malformed", "tpm::node_key_malformed"),
    ("tpm", "node-key-signature", "tpm::node_key_signature"),
    ("tpm", "node-key-nonce", "tpm::node_key_nonce"),
    ("tpm", "node-key-name", "tpm::node_key_name"),
    ("tpm", "node-key-attributes", "tpm::node_key_attributes"),
    ("tpm", "node-key-not-csr", "tpm::node_key_not_csr"),
    (
        "tpm",
        "node-key-not-certified",
        "tpm::node_key_not_certified",
    ),
    (
        "tpm",
        "unknown-ek",
        "tpm::without_enrollment_an_unknown_ek_is_refused",
    ),
    (
        "x509pop",
        "stale-generation",
        "refusals::x509pop_refuses_old_proofs_revoked_identities_and_expiries_past_grace",
    ),
    (
        "x509pop",
        "past-grace",
        "refusals::x509pop_refuses_old_proofs_revoked_identities_and_expiries_past_grace",
    ),
    (
        "x509pop",
        "clock-window",
        "refusals::x509pop_refuses_old_proofs_revoked_identities_and_expiries_past_grace",
    ),
    (
        "x509pop",
        "replayed",
        "refusals::an_x509pop_proof_is_spent_once_even_across_a_restart",
    ),
    (
        "cloud-iid",
        "cloud-malformed",
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-unknown-provider",
        "cloud_iid::cloud_iid_refusals_and_errors_outside_the_happy_cloud",
    ),
    (
        "cloud-iid",
        "cloud-signature",
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-issuer",
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-chain",
        "cloud_cms::an_azure_vm_joins_once_with_its_attested_document_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-signer",
        "cloud_cms::an_azure_vm_joins_once_with_its_attested_document_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-audience",
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-stale",
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-future",
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "instance-reused",
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "unknown-instance",
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-role",
        "cloud_iid::a_cloud_vm_joins_only_as_a_role_it_is_allowed",
    ),
    (
        "renew",
        "retired",
        "discovery::the_same_machine_commissions_twice",
    ),
    (
        "renew",
        "expired",
        "refusals::an_expired_certificate_reaches_renew_and_is_refused_as_expired",
    ),
    (
        "renew",
        "key-attestation-missing",
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "ak-mismatch",
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "node-key-not-csr",
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "site",
        "no-client-certificate",
        "discovery::the_site_api_refuses_callers_and_secret_requests_by_name",
    ),
    (
        "site",
        "certificate-identity",
        "discovery::the_site_api_refuses_callers_and_secret_requests_by_name",
    ),
    (
        "site",
        "unknown-certificate",
        "discovery::the_site_api_refuses_callers_and_secret_requests_by_name",
    ),
    (
        "site",
        "node-retired",
        "discovery::the_site_api_refuses_callers_and_secret_requests_by_name",
    ),
    (
        "site",
        "certificate-stale",
        "discovery::the_site_api_refuses_callers_and_secret_requests_by_name",
    ),
    (
        "site",
        "not-site-node",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "site",
        "lease-lost",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "site",
        "not-lease-holder",
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "site",
        "secret-signature",
        "discovery::the_site_api_refuses_callers_and_secret_requests_by_name",
    ),
    (
        "site",
        "secret-stale",
        "discovery::the_site_api_refuses_callers_and_secret_requests_by_name",
    ),
    (
        "site",
        "unknown-workflow",
        "discovery::secret_requests_name_their_workflow_and_each_gets_its_own_token",
    ),
    (
        "site",
        "workflow-closed",
        "discovery::secret_requests_name_their_workflow_and_each_gets_its_own_token",
    ),
    (
        "site",
        "workflow-mac",
        "discovery::secret_requests_name_their_workflow_and_each_gets_its_own_token",
    ),
    (
        "site",
        "workflow-busy",
        "discovery::secret_requests_name_their_workflow_and_each_gets_its_own_token",
    ),
    (
        "join",
        "join:csr-signature",
        "refusals::joins_refused_for_the_request_itself_name_their_reason",
    ),
    (
        "join",
        "join:unknown-attestor",
        "refusals::joins_refused_for_the_request_itself_name_their_reason",
    ),
    (
        "join",
        "token-unopenable",
        "refusals::joins_refused_for_the_request_itself_name_their_reason",
    ),
    (
        "join-token",
        "token-missing",
        "refusals::joins_refused_for_the_request_itself_name_their_reason",
    ),
    (
        "join-token",
        "token-malformed",
        "refusals::joins_refused_for_the_request_itself_name_their_reason",
    ),
    (
        "x509pop",
        "evidence-malformed",
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "x509pop",
        "signature",
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "x509pop",
        "unknown-certificate",
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "x509pop",
        "role",
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "x509pop",
        "retired",
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "x509pop",
        "deleted",
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "renew",
        "no-client-certificate",
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "certificate-identity",
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "unknown-certificate",
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "csr-key",
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "csr-signature",
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "stale-generation",
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "deleted",
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "tpm",
        "challenge-state",
        "tpm::a_challenge_state_that_does_not_open_is_refused",
    ),
    (
        "tpm",
        "quote-signature",
        "tpm::a_quote_with_a_bad_signature_or_another_nonce_is_refused",
    ),
    (
        "tpm",
        "quote-nonce",
        "tpm::a_quote_with_a_bad_signature_or_another_nonce_is_refused",
    ),
    (
        "tpm",
        "evidence-malformed",
        "tpm::tpm_evidence_that_does_not_parse_is_refused",
    ),
    (
        "join",
        "join:role",
        "refusals::joinservice_holds_plugin_attestors_to_its_own_checks",
    ),
    (
        "join",
        "join:node-key-statement",
        "refusals::joinservice_holds_plugin_attestors_to_its_own_checks",
    ),
    (
        "join",
        "join:unknown-pool",
        "refusals::joinservice_holds_plugin_attestors_to_its_own_checks",
    ),
    (
        "renew",
        "node-key-malformed",
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "node-key-signature",
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "node-key-nonce",
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "node-key-name",
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "node-key-attributes",
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "tpm",
        "enrollment-denied",
        "tpm::a_denied_enrollment_refuses_the_waiting_join",
    ),
    (
        "tpm",
        "challenge-expired",
        "tpm::an_answer_after_the_challenges_deadline_is_refused",
    ),
    (
        "tpm",
        "ak-attributes",
        "tpm::a_hello_whose_ak_is_no_attestation_key_is_refused",
    ),
    (
        "tpm",
        "ek-service",
        "ekservice::intel_service_certificates_join_cached_and_bounded",
    ),
];

/// Reasons no e2e test sees yet: only unit tests of the control plane do.
/// This list may only shrink; a new reason goes in [`TESTED`] with its test.
const UNTESTED: &[(&str, &str)] = &[
    // An EK certificate for an RSA key with the ROCA fingerprint, which
    // swtpm never makes (the unit tests use a vector).
    ("tpm", "ek-roca"),
    // A certificate revoked within its node's current generation: no
    // operation makes one (revoke-identity and a reclaim raise the
    // generation, stale-generation; a delete is deleted), so only a
    // database edited by hand reaches these defensive checks.
    ("x509pop", "revoked"),
    ("renew", "revoked"),
    // A stored certificate with two AK statements, or one that does not
    // parse, or naming an AK without an attestation key's attributes: this
    // control plane never issues one (the tpm join checked the AK).
    ("renew", "statement-malformed"),
    ("renew", "ak-attributes"),
];

/// The body of `fn name` in `text` (to the closing brace at its indent).
fn body<'a>(text: &'a str, name: &str) -> Option<&'a str> {
    let start = text.find(&format!("fn {name}("))?;
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let indent = &text[line_start..start];
    let indent = &indent[..indent.len() - indent.trim_start().len()];
    let end = text[start..].find(&format!("\n{indent}}}\n"))? + start;
    let before = &text[..line_start];
    let attributes: Vec<&str> = before
        .lines()
        .rev()
        .take_while(|l| l.trim_start().starts_with("#["))
        .collect();
    attributes
        .iter()
        .any(|a| a.trim() == "#[test]")
        .then_some(&text[start..end])
}

/// The table for readers, as `tests/e2e/reasons.md` must hold it.
fn markdown() -> String {
    let mut out = String::from(
        "# Refusal reasons and the e2e test that sees each\n\n\
         Generated from `tests/e2e/reasons.rs` (its test fails when this file differs).\n\
         Each test sees ACCESS_DENIED at the agent (the `bcd` binary, or bcd's client\n\
         library over HTTPS where bcd never sends such a request) and the reason in the\n\
         control plane's refusal event. `join` is JoinService itself, whichever attestor;\n\
         `renew` is `security.renew.refused`, `site` `security.site.refused`, the others\n\
         attestors (`security.join.refused`).\n\n\
         | place | reason | e2e test |\n|---|---|---|\n",
    );
    for (place, reason) in bc_controlplane::reasons::all().map(|(p, r)| (p.name, r)) {
        let test = TESTED
            .iter()
            .find(|(p, r, _)| *p == place && *r == reason)
            .map_or("none yet (unit tests only)".to_owned(), |(_, _, t)| {
                format!("`{t}`")
            });
        out.push_str(&format!("| {place} | `{reason}` | {test} |\n"));
    }
    out
}

#[test]
fn every_refusal_reason_has_an_e2e_test() {
    let registry: BTreeSet<(&str, &str)> = bc_controlplane::reasons::all()
        .map(|(p, r)| (p.name, r))
        .collect();
    let mut rows = BTreeSet::new();
    let mut problems = Vec::new();
    for pair in TESTED
        .iter()
        .map(|(p, r, _)| (*p, *r))
        .chain(UNTESTED.iter().copied())
    {
        if !rows.insert(pair) {
            problems.push(format!("{pair:?} has two rows"));
        }
        if !registry.contains(&pair) {
            problems.push(format!(
                "{pair:?} is no reason of the control plane any more"
            ));
        }
    }
    for pair in &registry {
        if !rows.contains(pair) {
            problems.push(format!(
                "{pair:?} has no e2e test: add one and its row to TESTED"
            ));
        }
    }
    for (place, reason, test) in TESTED {
        let (module, name) = test.split_once("::").expect("module::fn");
        let path = workspace().join("tests/e2e").join(format!("{module}.rs"));
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        match body(&text, name) {
            None => problems.push(format!("({place}, {reason}): no #[test] fn {test}")),
            Some(b) if !b.contains(&format!("\"{reason}\"")) => problems.push(format!(
                "({place}, {reason}): {test} never names {reason:?}"
            )),
            Some(_) => {}
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let doc = workspace().join("tests/e2e/reasons.md");
    let want = markdown();
    let have = std::fs::read_to_string(&doc).unwrap_or_default();
    if have != want {
        if std::env::var_os("BCD_WRITE_REASONS").is_some() {
            std::fs::write(&doc, &want).expect("write reasons.md");
        } else {
            panic!(
                "tests/e2e/reasons.md is not the table: run this test with BCD_WRITE_REASONS=1, \
                 or write:\n{want}"
            );
        }
    }
}
