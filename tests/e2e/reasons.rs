//! Every refusal reason the control plane can give has a test that sees
//! it refused and the reason at the server, and this table says how: through
//! the `bcd` binary ([`Via::Bcd`]), through bcd's client library or a raw
//! request ([`Via::Client`]), against a control plane
//! built in the test process ([`Via::InProcess`]), or in unit tests only
//! ([`UNTESTED`]). The test below fails when a reason of
//! [`bc_controlplane::reasons::PLACES`] (derived from each place's reason
//! enum, so complete) has no row, when a row's test is not compiled into
//! this test binary (libtest's own list of its tests; a build without
//! failpoints, the release bcd's run, may lack only what is gated on
//! them), when its body does not do what its class says, and when
//! `tests/e2e/reasons.md` (the table for readers) is not what this table
//! says.

use std::collections::BTreeSet;

use crate::harness::{output_within, stderr, stdout, workspace, DEADLINE};

/// How a row's test reaches the refusal.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Via {
    /// The `bcd` binary runs and is refused: the test checks what bcd ended
    /// with (ACCESS_DENIED, its exit code) and the reason with
    /// `refused_once`.
    Bcd,
    /// bcd's client library or a raw HTTPS request, not the binary (often
    /// what bcd never sends: an altered answer, a forged CSR): the test
    /// checks the ACCESS_DENIED answer and the reason at the server.
    Client,
    /// A control plane built in the test process: plugin attestors behind
    /// bcd's client library, or JoinService called directly.
    InProcess,
}

use Via::{Bcd, Client, InProcess};

impl Via {
    fn name(self) -> &'static str {
        match self {
            Bcd => "bcd",
            Client => "client",
            InProcess => "in-process",
        }
    }
}

/// (place, reason, how, the e2e test that sees it: `module::fn`).
const TESTED: &[(&str, &str, Via, &str)] = &[
    (
        "join",
        "join:csr-key",
        Client,
        "refusals::a_join_whose_csr_key_is_not_p256_is_refused",
    ),
    (
        "join",
        "reclaim",
        Bcd,
        "reclaim::a_known_machine_is_refused_unless_the_token_allows_a_reclaim",
    ),
    (
        "join",
        "join:reclaim-unknown-node",
        Bcd,
        "reclaim::a_reclaim_of_a_deleted_retired_or_other_role_node_is_refused",
    ),
    (
        "join",
        "join:reclaim-retired",
        Bcd,
        "reclaim::a_reclaim_of_a_deleted_retired_or_other_role_node_is_refused",
    ),
    (
        "join",
        "join:reclaim-role",
        Bcd,
        "reclaim::a_reclaim_of_a_deleted_retired_or_other_role_node_is_refused",
    ),
    (
        "join",
        "bound-elsewhere",
        Bcd,
        "tpm::another_tpm_cannot_join_as_the_first_ones_node",
    ),
    (
        "join",
        "join:pool-attestor",
        Bcd,
        "tpm::a_pool_that_requires_tpm_refuses_a_token_join",
    ),
    (
        "join",
        "join:pool-ek-assurance",
        Bcd,
        "eksource::the_ek_assurance_is_recorded_and_a_pool_may_require_a_minimum",
    ),
    (
        "join",
        "join:expect-product-uuid",
        Bcd,
        "join_token::expect_binding::other_machines_are_refused_and_spend_no_use",
    ),
    (
        "join",
        "join:expect-mac",
        Bcd,
        "join_token::expect_binding::other_machines_are_refused_and_spend_no_use",
    ),
    (
        "join-token",
        "token-unknown",
        Bcd,
        "join_token::unknown_token_is_refused",
    ),
    (
        "join-token",
        "token-secret",
        Bcd,
        "join_token::wrong_secret_is_refused",
    ),
    (
        "join-token",
        "token-revoked",
        Bcd,
        "join_token::revoked_token_is_refused",
    ),
    (
        "join-token",
        "token-expired",
        Bcd,
        "join_token::expired_token_is_refused_at_database_time",
    ),
    (
        "join-token",
        "token-exhausted",
        Bcd,
        "join_token::used_up_token_is_refused",
    ),
    (
        "join-token",
        "token-role",
        Bcd,
        "join_token::a_token_admits_only_its_role",
    ),
    (
        "provisioned",
        "token-role",
        Bcd,
        "provisioned::provisioned_refusals",
    ),
    (
        "provisioned",
        "token-exhausted",
        Bcd,
        "provisioned::a_provisioned_token_joins_its_machine_once_as_a_new_node",
    ),
    (
        "provisioned",
        "not-single-use",
        Bcd,
        "provisioned::provisioned_refusals",
    ),
    (
        "provisioned",
        "no-product-uuid",
        Bcd,
        "provisioned::provisioned_refusals",
    ),
    (
        "provisioned",
        "unbound",
        Bcd,
        "provisioned::provisioned_refusals",
    ),
    (
        "provisioned",
        "product-uuid-mismatch",
        Bcd,
        "provisioned::provisioned_refusals",
    ),
    (
        "discovery",
        "discovery-role",
        InProcess,
        "discovery::only_single_use_tokens_and_ramdisks_are_admitted",
    ),
    (
        "discovery",
        "assertion-malformed",
        Bcd,
        "discovery::a_used_assertion_rewrapped_admits_nothing",
    ),
    (
        "discovery",
        "assertion-reused",
        Bcd,
        "discovery::a_ramdisk_joins_once_with_its_site_nodes_assertion",
    ),
    (
        "discovery",
        "token-role",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "token-exhausted",
        Bcd,
        "discovery::a_ramdisk_joins_once_with_its_site_nodes_assertion",
    ),
    (
        "discovery",
        "token-not-single-use",
        Bcd,
        "discovery::only_single_use_tokens_and_ramdisks_are_admitted",
    ),
    (
        "discovery",
        "token-site",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "token-mac",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "signer-unknown",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "signer-retired",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "signer-not-site",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "lease-not-held",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "lease-epoch",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "signer-certificate",
        Bcd,
        "discovery::an_expired_signer_certificate_vouches_for_nobody",
    ),
    (
        "discovery",
        "assertion-signature",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "assertion-stale",
        Bcd,
        "discovery::assertions_are_stale_after_the_configured_max_age",
    ),
    (
        "discovery",
        "assertion-future",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "mac-not-claimed",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "product-uuid-mismatch",
        Bcd,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "discovery",
        "boot-ek-missing",
        Bcd,
        "discovery_tpm::an_entry_that_expects_an_ek_admits_only_that_tpm",
    ),
    (
        "discovery",
        "boot-ek-mismatch",
        Bcd,
        "discovery_tpm::an_entry_for_a_known_node_admits_only_its_tpm",
    ),
    (
        "discovery",
        "approval-denied",
        Bcd,
        "approval::a_neighbours_join_waits_for_the_operator_who_denies_it_and_approves_the_machine",
    ),
    (
        "discovery",
        "approval-busy",
        Bcd,
        "approval::an_approval_flood_from_one_script_leaves_the_victim_heard_and_one_deny_ends_it",
    ),
    (
        "tpm",
        "tpm-role",
        Bcd,
        "site::a_tpm_joined_site_node_serves_and_vouches",
    ),
    (
        "tpm",
        "ek-certificate",
        Bcd,
        "realek::an_intermediate_is_no_anchor_and_a_ca_is_no_ek",
    ),
    (
        "tpm",
        "ek-chain",
        Bcd,
        "ekchain::the_intermediate_nowhere_is_refused_ek_chain",
    ),
    (
        "tpm",
        "ek-mismatch",
        Bcd,
        "ektemplate::identify_says_when_the_tpms_ek_is_not_its_certificates",
    ),
    (
        "tpm",
        "challenge-reused",
        Client,
        "replay::a_replayed_tpm_answer_is_refused_and_the_node_keeps_renewing",
    ),
    (
        "tpm",
        "challenge-secret",
        Client,
        "tpm::a_wrong_credential_is_refused",
    ),
    (
        "tpm",
        "quote-pcrs",
        Client,
        "tpm::pcr_values_must_match_the_quote",
    ),
    (
        "tpm",
        "pcr-policy",
        Bcd,
        "pcr::a_pcr_that_does_not_meet_the_policy_is_refused",
    ),
    (
        "tpm",
        "eventlog-malformed",
        Bcd,
        "mboot::a_log_that_does_not_parse_is_refused_eventlog_malformed",
    ),
    (
        "tpm",
        "eventlog-replay",
        Bcd,
        "mboot::a_log_altered_after_boot_is_refused_eventlog_replay",
    ),
    (
        "tpm",
        "eventlog-bank-empty",
        Bcd,
        "mboot::a_pcr_every_boot_extends_left_unextended_is_refused_eventlog_bank_empty",
    ),
    (
        "tpm",
        "boot-secure-boot",
        Bcd,
        "mboot::secure_boot_off_under_a_policy_that_requires_it_is_refused_boot_secure_boot",
    ),
    (
        "tpm",
        "boot-app",
        Bcd,
        "mboot::a_join_whose_log_the_boot_policy_does_not_allow_is_refused_boot_app",
    ),
    (
        "tpm",
        "boot-dbx",
        Bcd,
        "mboot::a_dbx_without_the_entries_of_an_official_update_is_refused_boot_dbx",
    ),
    (
        "tpm",
        "boot-cmdline",
        Bcd,
        "mboot::a_kernel_command_line_no_pattern_allows_is_refused_boot_cmdline",
    ),
    (
        "tpm",
        "boot-firmware",
        Bcd,
        "mboot::firmware_older_than_the_policys_minimum_is_refused_boot_firmware",
    ),
    (
        "tpm",
        "node-key-malformed",
        Client,
        "tpm::node_key_malformed",
    ),
    (
        "tpm",
        "node-key-signature",
        Client,
        "tpm::node_key_signature",
    ),
    ("tpm", "node-key-nonce", Client, "tpm::node_key_nonce"),
    ("tpm", "node-key-name", Client, "tpm::node_key_name"),
    (
        "tpm",
        "node-key-attributes",
        Client,
        "tpm::node_key_attributes",
    ),
    ("tpm", "node-key-not-csr", Client, "tpm::node_key_not_csr"),
    (
        "tpm",
        "node-key-not-certified",
        Client,
        "tpm::node_key_not_certified",
    ),
    (
        "tpm",
        "unknown-ek",
        Bcd,
        "tpm::without_enrollment_an_unknown_ek_is_refused",
    ),
    (
        "x509pop",
        "stale-generation",
        Bcd,
        "refusals::x509pop_refuses_old_proofs_revoked_identities_and_expiries_past_grace",
    ),
    (
        "x509pop",
        "past-grace",
        Bcd,
        "refusals::x509pop_refuses_old_proofs_revoked_identities_and_expiries_past_grace",
    ),
    (
        "x509pop",
        "clock-window",
        Bcd,
        "refusals::x509pop_refuses_old_proofs_revoked_identities_and_expiries_past_grace",
    ),
    (
        "x509pop",
        "replayed",
        Client,
        "refusals::an_x509pop_proof_is_spent_once_even_across_a_restart",
    ),
    (
        "cloud-iid",
        "cloud-malformed",
        Bcd,
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-unknown-provider",
        Bcd,
        "cloud_iid::cloud_iid_refusals_and_errors_outside_the_happy_cloud",
    ),
    (
        "cloud-iid",
        "cloud-signature",
        Bcd,
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-issuer",
        Bcd,
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-chain",
        Bcd,
        "cloud_cms::an_azure_vm_joins_once_with_its_attested_document_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-signer",
        Bcd,
        "cloud_cms::an_azure_vm_joins_once_with_its_attested_document_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-audience",
        Bcd,
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-stale",
        Bcd,
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-future",
        Bcd,
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "instance-reused",
        Bcd,
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "unknown-instance",
        Bcd,
        "cloud_iid::a_gcp_vm_joins_once_with_its_identity_token_and_every_bad_one_is_refused",
    ),
    (
        "cloud-iid",
        "cloud-role",
        Bcd,
        "cloud_iid::a_cloud_vm_joins_only_as_a_role_it_is_allowed",
    ),
    (
        "cloud-iid",
        "cloud-jwks",
        Bcd,
        "cloud_oidc::an_oidc_token_joins_once_and_every_bad_one_is_refused_by_its_reason",
    ),
    (
        "renew",
        "retired",
        Bcd,
        "discovery::the_same_machine_commissions_twice",
    ),
    (
        "renew",
        "expired",
        Bcd,
        "refusals::an_expired_certificate_reaches_renew_and_is_refused_as_expired",
    ),
    (
        "renew",
        "key-attestation-missing",
        Client,
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "ak-mismatch",
        Client,
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "node-key-not-csr",
        Client,
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "site",
        "no-client-certificate",
        Client,
        "discovery::the_site_api_refuses_callers_and_secret_requests_by_name",
    ),
    (
        "site",
        "certificate-identity",
        Client,
        "discovery::the_site_api_refuses_callers_and_secret_requests_by_name",
    ),
    (
        "site",
        "unknown-certificate",
        Bcd,
        "restore::a_site_node_that_renewed_after_a_restored_backup_is_refused_its_lease",
    ),
    (
        "site",
        "node-retired",
        Bcd,
        "site::a_running_site_whose_node_is_retired_is_refused_node_retired",
    ),
    (
        "site",
        "certificate-stale",
        Bcd,
        "site::a_running_site_whose_identity_is_revoked_is_refused_certificate_stale",
    ),
    (
        "site",
        "not-site-node",
        Bcd,
        "site::a_site_node_serving_another_site_is_refused_not_site_node",
    ),
    (
        "site",
        "lease-lost",
        Bcd,
        "site::a_running_site_renewing_a_lease_that_ran_out_is_refused_lease_lost",
    ),
    (
        "site",
        "not-lease-holder",
        Client,
        "discovery::every_discovery_refusal_names_its_reason",
    ),
    (
        "site",
        "secret-signature",
        Client,
        "discovery::the_site_api_refuses_callers_and_secret_requests_by_name",
    ),
    (
        "site",
        "secret-stale",
        Bcd,
        "site::a_running_sites_stale_secret_request_is_refused",
    ),
    (
        "site",
        "unknown-workflow",
        Client,
        "discovery::secret_requests_name_their_workflow_and_each_gets_its_own_token",
    ),
    (
        "site",
        "workflow-closed",
        Client,
        "discovery::secret_requests_name_their_workflow_and_each_gets_its_own_token",
    ),
    (
        "site",
        "workflow-mac",
        Client,
        "discovery::secret_requests_name_their_workflow_and_each_gets_its_own_token",
    ),
    (
        "site",
        "workflow-busy",
        Bcd,
        "site::a_running_site_asked_for_one_entry_too_often_is_refused_workflow_busy",
    ),
    (
        "join",
        "join:csr-signature",
        Client,
        "refusals::joins_refused_for_the_request_itself_name_their_reason",
    ),
    (
        "join",
        "join:unknown-attestor",
        Client,
        "refusals::joins_refused_for_the_request_itself_name_their_reason",
    ),
    (
        "join",
        "token-unopenable",
        Bcd,
        "refusals::a_token_sealed_for_another_control_plane_is_unopenable",
    ),
    (
        "join-token",
        "token-missing",
        Client,
        "refusals::joins_refused_for_the_request_itself_name_their_reason",
    ),
    (
        "join-token",
        "token-malformed",
        Client,
        "refusals::joins_refused_for_the_request_itself_name_their_reason",
    ),
    (
        "x509pop",
        "evidence-malformed",
        Client,
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "x509pop",
        "signature",
        Client,
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "x509pop",
        "unknown-certificate",
        Client,
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "x509pop",
        "role",
        Client,
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "x509pop",
        "retired",
        Bcd,
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "x509pop",
        "revoked",
        Bcd,
        "refusals::a_certificate_revoked_in_its_current_generation_neither_rejoins_nor_renews",
    ),
    (
        "x509pop",
        "deleted",
        Bcd,
        "refusals::x509pop_refuses_bad_evidence_other_csrs_nodes_and_roles_and_gone_nodes",
    ),
    (
        "renew",
        "no-client-certificate",
        Client,
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "certificate-identity",
        Client,
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "unknown-certificate",
        Client,
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "csr-key",
        Client,
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "csr-signature",
        Client,
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "stale-generation",
        Bcd,
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "renew",
        "statement-malformed",
        Bcd,
        "refusals::a_certificate_with_two_ak_statements_is_refused_at_renew",
    ),
    (
        "renew",
        "ak-attributes",
        Client,
        "refusals::a_certificate_naming_a_key_that_is_no_ak_is_refused_at_renew",
    ),
    (
        "renew",
        "revoked",
        Bcd,
        "refusals::a_certificate_revoked_in_its_current_generation_neither_rejoins_nor_renews",
    ),
    (
        "renew",
        "deleted",
        Bcd,
        "refusals::renewals_refused_for_the_caller_the_csr_or_the_node_name_their_reason",
    ),
    (
        "tpm",
        "challenge-state",
        Client,
        "tpm::a_challenge_state_that_does_not_open_is_refused",
    ),
    (
        "tpm",
        "quote-signature",
        Client,
        "tpm::a_quote_with_a_bad_signature_or_another_nonce_is_refused",
    ),
    (
        "tpm",
        "quote-nonce",
        Client,
        "tpm::a_quote_with_a_bad_signature_or_another_nonce_is_refused",
    ),
    (
        "tpm",
        "evidence-malformed",
        Client,
        "tpm::tpm_evidence_that_does_not_parse_is_refused",
    ),
    (
        "join",
        "join:role",
        InProcess,
        "refusals::joinservice_holds_plugin_attestors_to_its_own_checks",
    ),
    (
        "join",
        "join:node-key-statement",
        InProcess,
        "refusals::joinservice_holds_plugin_attestors_to_its_own_checks",
    ),
    (
        "join",
        "join:unknown-pool",
        InProcess,
        "refusals::joinservice_holds_plugin_attestors_to_its_own_checks",
    ),
    (
        "renew",
        "node-key-malformed",
        Client,
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "node-key-signature",
        Client,
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "node-key-nonce",
        Client,
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "node-key-name",
        Client,
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "node-key-attributes",
        Client,
        "refusals::a_tpm_node_cannot_renew_without_its_aks_proof_of_the_next_key",
    ),
    (
        "renew",
        "quote-signature",
        Bcd,
        "renewboot::boot_evidence_altered_on_its_way_is_refused_quote_signature_nonce_pcrs",
    ),
    (
        "renew",
        "quote-nonce",
        Bcd,
        "renewboot::boot_evidence_altered_on_its_way_is_refused_quote_signature_nonce_pcrs",
    ),
    (
        "renew",
        "quote-pcrs",
        Bcd,
        "renewboot::boot_evidence_altered_on_its_way_is_refused_quote_signature_nonce_pcrs",
    ),
    (
        "renew",
        "eventlog-malformed",
        Bcd,
        "renewboot::a_renewal_after_a_reboot_whose_log_does_not_parse_is_refused_eventlog_malformed",
    ),
    (
        "renew",
        "eventlog-replay",
        Bcd,
        "renewboot::a_renewal_whose_log_the_pcrs_contradict_is_refused_eventlog_replay",
    ),
    (
        "renew",
        "eventlog-bank-empty",
        Bcd,
        "renewboot::a_policy_set_after_a_join_of_an_unmeasured_boot_is_refused_eventlog_bank_empty",
    ),
    (
        "renew",
        "boot-secure-boot",
        Bcd,
        "renewboot::a_renewal_under_a_policy_raised_to_secure_boot_is_refused_boot_secure_boot",
    ),
    (
        "renew",
        "boot-app",
        Bcd,
        "renewboot::a_renewal_after_a_reboot_into_another_kernel_is_refused_boot_app",
    ),
    (
        "renew",
        "boot-dbx",
        Bcd,
        "renewboot::a_policy_raised_to_an_official_dbx_update_is_refused_boot_dbx",
    ),
    (
        "renew",
        "boot-cmdline",
        Bcd,
        "renewboot::a_renewal_after_a_reboot_with_another_command_line_is_refused_boot_cmdline",
    ),
    (
        "renew",
        "boot-firmware",
        Bcd,
        "renewboot::a_policy_raised_to_newer_firmware_is_refused_boot_firmware",
    ),
    (
        "tpm",
        "enrollment-denied",
        Bcd,
        "tpm::a_denied_enrollment_refuses_the_waiting_join",
    ),
    (
        "tpm",
        "challenge-expired",
        Bcd,
        "tpm::bcds_answer_after_the_challenges_deadline_is_refused",
    ),
    (
        "tpm",
        "ak-attributes",
        Client,
        "tpm::a_hello_whose_ak_is_no_attestation_key_is_refused",
    ),
    (
        "tpm",
        "ek-roca",
        Bcd,
        "tpm::an_ek_certificate_with_the_roca_fingerprint_is_refused",
    ),
    (
        "tpm",
        "ek-service",
        Bcd,
        "ekservice::intel_service_certificates_join_cached_and_bounded",
    ),
];

/// Reasons no e2e test sees yet: only unit tests of the control plane do.
/// This list may only shrink; a new reason goes in [`TESTED`] with its test.
const UNTESTED: &[(&str, &str)] = &[];

/// The text of `fn name` in `text` (to the closing brace at its indent),
/// and whether it is a `#[test]`.
fn function<'a>(text: &'a str, name: &str) -> Option<(&'a str, bool)> {
    let start = text.find(&format!("fn {name}("))?;
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let indent = &text[line_start..start];
    let indent = &indent[..indent.len() - indent.trim_start().len()];
    let end = text[start..].find(&format!("\n{indent}}}\n"))? + start;
    let before = &text[..line_start];
    let is_test = before
        .lines()
        .rev()
        .take_while(|l| l.trim_start().starts_with("#["))
        .any(|a| a.trim() == "#[test]");
    Some((&text[start..end], is_test))
}

/// The source of the e2e module `module` ("" when there is none).
fn module_text(module: &str) -> String {
    let path = workspace().join("tests/e2e").join(format!("{module}.rs"));
    std::fs::read_to_string(path).unwrap_or_default()
}

/// The e2e modules that hold tests' helpers (not the harness: its runners
/// are named in [`BCD_RUNNERS`]).
fn modules() -> Vec<String> {
    let dir = workspace().join("tests/e2e");
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter_map(|e| {
                    e.file_name()
                        .to_str()?
                        .strip_suffix(".rs")
                        .map(str::to_owned)
                })
                .filter(|m| m != "harness" && m != "main")
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// The names `code` calls: `name(`, `x.name(`, `module::name(`.
fn calls(code: &str) -> Vec<&str> {
    let bytes = code.as_bytes();
    let mut out = Vec::new();
    for (i, b) in bytes.iter().enumerate() {
        if *b != b'(' {
            continue;
        }
        let start = code[..i]
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_alphanumeric() || *c == '_' || *c == ':'))
            .map_or(0, |(j, c)| j + c.len_utf8());
        if start < i {
            out.push(&code[start..i]);
        }
    }
    out
}

/// `code` and the helpers it calls, two levels deep: a function of its own
/// module or of an e2e module it names (`crate::site::`), or of the one a
/// path names (`discovery::boot_add(`); never a test itself.
fn with_helpers(module: &str, code: &str, depth: u32) -> String {
    let own = module_text(module);
    let imported: Vec<String> = modules()
        .into_iter()
        .filter(|m| own.contains(&format!("crate::{m}::")))
        .collect();
    let mut out = code.to_owned();
    let mut seen = BTreeSet::new();
    for call in calls(code) {
        let (candidates, name) = match call.rsplit_once("::") {
            Some((path, name)) => (
                vec![path.rsplit("::").next().unwrap_or(path).to_owned()],
                name,
            ),
            None => (
                std::iter::once(module.to_owned())
                    .chain(imported.iter().cloned())
                    .collect(),
                call,
            ),
        };
        for m in candidates {
            if !seen.insert((m.clone(), name.to_owned())) {
                continue;
            }
            let text = if m == module {
                own.clone()
            } else {
                module_text(&m)
            };
            if let Some((helper, false)) = function(&text, name) {
                out.push('\n');
                if depth > 1 {
                    out.push_str(&with_helpers(&m, helper, depth - 1));
                } else {
                    out.push_str(helper);
                }
                break;
            }
        }
    }
    out
}

/// Ways a test runs the `bcd` binary (the harness's runners, `bcd site`'s).
const BCD_RUNNERS: &[&str] = &[
    ".run(&",
    ".command(&",
    "join_with_token(",
    "token_join(",
    "bin(\"bcd\")",
    "BootServer::start",
];

/// What a test asserts of a refused `bcd`: its ACCESS_DENIED, its exit
/// code, the exit script `bcd site` serves, ACCESS_DENIED in its log.
const BCD_REFUSED: &[&str] = &[
    "assert_access_denied(",
    "assert_renew_refused(",
    "status.code()",
    "assert_exit_script(",
    "contains(\"access denied\")",
];

/// A statement that makes its request some other way than through bcd.
const NOT_BCD: &[&str] = &[
    "svc.",
    "JoinService",
    "InProcessServer",
    "send(",
    "client.",
    "assert_site_refused(",
    "rt().block_on",
];

/// What the control plane recorded, checked some way.
const AT_SERVER: &[&str] = &[
    "refused_once(",
    "refusal_reasons(",
    ".refusals()",
    ".refusal(",
    "refusal_counts(",
    "security.renew.refused",
    "security.site.refused",
];

/// What is wrong with `test` as a test of `reason` by `via`, if anything.
/// `bcd`: the test (with its helpers) runs bcd and asserts bcd's side of
/// the refusal, and a statement naming the reason checks it with
/// `refused_once` and makes no request some other way. `in-process`: it
/// serves a control plane in the test process. Every class: the body names
/// the reason and checks it at the server.
fn misfit(test: &str, reason: &str, via: Via) -> Option<String> {
    // `module::fn`, or `module::inner::fn` for a test in an inner module.
    let (module, path) = test.split_once("::")?;
    let name = path.rsplit("::").next().unwrap_or(path);
    let text = module_text(module);
    let Some((body, true)) = function(&text, name) else {
        return Some(format!("is no #[test] fn in tests/e2e/{module}.rs"));
    };
    let literal = format!("\"{reason}\"");
    if !body.contains(&literal) {
        return Some(format!("never names {reason:?}"));
    }
    let code = with_helpers(module, body, 2);
    let has = |needles: &[&str]| needles.iter().any(|n| code.contains(n));
    let statements = body.match_indices(&literal).map(|(i, _)| {
        let from = body[..i].rfind(';').map_or(0, |j| j + 1);
        let to = body[i..].find(';').map_or(body.len(), |j| i + j);
        &body[from..to]
    });
    let mut checked = statements.filter(|s| !NOT_BCD.iter().any(|n| s.contains(n)));
    match via {
        Bcd if !has(BCD_RUNNERS) => Some("runs no bcd (the harness's runners)".into()),
        Bcd if !has(BCD_REFUSED) => Some(format!("asserts none of {BCD_REFUSED:?}")),
        Bcd if !checked.any(|s| with_helpers(module, s, 2).contains("refused_once(")) => {
            Some(format!(
                "has no statement naming {reason:?} that checks bcd's refusal with refused_once"
            ))
        }
        InProcess if !has(&["InProcessServer", "JoinService"]) => {
            Some("serves no control plane in the test process".into())
        }
        _ if !has(AT_SERVER) => Some("checks no reason at the server".into()),
        _ => None,
    }
}

/// Whether `test` (`module::fn`, `module::inner::fn`) is compiled only
/// with failpoints: its module is gated in `main.rs`, or its inner module
/// or the fn itself is.
fn needs_failpoints(test: &str) -> bool {
    let Some((module, path)) = test.split_once("::") else {
        return false;
    };
    if gated(&module_text("main"), &format!("mod {module};")) {
        return true;
    }
    let text = module_text(module);
    let mut segments: Vec<&str> = path.split("::").collect();
    let name = segments.pop().unwrap_or(path);
    segments
        .iter()
        .any(|inner| gated(&text, &format!("mod {inner} {{")))
        || gated(&text, &format!("fn {name}("))
}

/// Whether the item whose line holds `item` in `text` carries
/// `#[cfg(feature = "failpoints")]` among the attributes above it.
fn gated(text: &str, item: &str) -> bool {
    let Some(start) = text.find(item) else {
        return false;
    };
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    text[..line_start]
        .lines()
        .rev()
        .map(str::trim)
        .filter(|l| !l.starts_with("//"))
        .take_while(|l| l.starts_with("#["))
        .any(|a| a == "#[cfg(feature = \"failpoints\")]")
}

/// The tests compiled into this test binary (`module::fn`), as libtest
/// lists them: a test left out by `cfg` is not there.
fn compiled_tests() -> BTreeSet<String> {
    let exe = std::env::current_exe().expect("current_exe");
    let mut cmd = std::process::Command::new(exe);
    cmd.args(["--list", "--format", "terse"]);
    let out = output_within(cmd, DEADLINE);
    assert!(out.status.success(), "--list: {}", stderr(&out));
    stdout(&out)
        .lines()
        .filter_map(|l| l.strip_suffix(": test"))
        .map(str::to_owned)
        .collect()
}

/// The table for readers, as `tests/e2e/reasons.md` must hold it.
fn markdown() -> String {
    let mut out = String::from(
        "# Refusal reasons and the test that sees each\n\n\
         Generated from `tests/e2e/reasons.rs` (its test fails when this file differs,\n\
         when a test named here is not compiled into the e2e binary that runs it, and\n\
         when a test does not do what its class says). Each test sees the refusal and\n\
         the reason in the control plane's refusal event; `via` says how:\n\n\
         - `bcd`: the `bcd` binary runs and is refused (ACCESS_DENIED, its exit code),\n\
         \x20 the reason checked with `refused_once`;\n\
         - `client`: bcd's client library or a raw HTTPS request, not the binary\n\
         \x20 (often what bcd never sends: an altered answer, a forged CSR), sees\n\
         \x20 ACCESS_DENIED;\n\
         - `in-process`: a control plane built in the test process: plugin attestors\n\
         \x20 behind bcd's client library, or JoinService called directly;\n\
         - `unit`: no e2e test yet, unit tests of the control plane only.\n\n\
         `join` is JoinService itself, whichever attestor; `renew` is\n\
         `security.renew.refused`, `site` `security.site.refused`, the others\n\
         attestors (`security.join.refused`).\n\n\
         | place | reason | via | test |\n|---|---|---|---|\n",
    );
    for (place, reason) in bc_controlplane::reasons::all().map(|(p, r)| (p.name, r)) {
        let row = TESTED
            .iter()
            .find(|(p, r, _, _)| *p == place && *r == reason)
            .map_or(("unit", "none yet".to_owned()), |(_, _, via, t)| {
                (via.name(), format!("`{t}`"))
            });
        out.push_str(&format!(
            "| {place} | `{reason}` | {} | {} |\n",
            row.0, row.1
        ));
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
        .map(|(p, r, _, _)| (*p, *r))
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
    let compiled = compiled_tests();
    for (place, reason, via, test) in TESTED {
        // A build without failpoints (the release bcd's run) leaves out
        // what needs them, and nothing else.
        let required = cfg!(feature = "failpoints") || !needs_failpoints(test);
        if !compiled.contains(*test) && required {
            problems.push(format!(
                "({place}, {reason}): {test} is not compiled into this test binary \
                 (absent, or gated on a feature this build lacks: run with --features bcd/failpoints)"
            ));
        } else if let Some(why) = misfit(test, reason, *via) {
            problems.push(format!(
                "({place}, {reason}) via {}: {test} {why}",
                via.name()
            ));
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
