//! Frozen key templates. Every field of a primary's template feeds its
//! derivation, so a change here silently gives every machine other keys:
//! tests pin the marshalled bytes.

use tss_esapi::attributes::ObjectAttributesBuilder;
use tss_esapi::interface_types::algorithm::{HashingAlgorithm, PublicAlgorithm};
use tss_esapi::interface_types::ecc::EccCurve;
use tss_esapi::structures::{
    EccParameter, EccPoint, EccScheme, HashScheme, KeyDerivationFunctionScheme, Public,
    PublicBuilder, PublicEccParameters, PublicEccParametersBuilder, SymmetricDefinitionObject,
};

use super::{cmd, TpmError};

/// The AK: restricted ECDSA-P256-SHA256 signing key (attributes 0x00050472:
/// fixedTPM, fixedParent, sensitiveDataOrigin, userWithAuth, noDA,
/// restricted, sign), empty unique.
pub(crate) fn ak_template() -> Result<Public, TpmError> {
    let params = cmd(
        "CreatePrimary",
        PublicEccParametersBuilder::new()
            .with_symmetric(SymmetricDefinitionObject::Null)
            .with_ecc_scheme(EccScheme::EcDsa(HashScheme::new(HashingAlgorithm::Sha256)))
            .with_curve(EccCurve::NistP256)
            .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
            .with_is_signing_key(true)
            .with_restricted(true)
            .build(),
    )?;
    ecc_public(true, params, EccPoint::default())
}

/// A node key: unrestricted P-256 signing key (attributes 0x00040472:
/// fixedTPM, fixedParent, sensitiveDataOrigin, userWithAuth, noDA, sign;
/// decrypt clear) with a NULL scheme, so each signature picks its hash. The
/// 32-byte unique goes in `unique.x` with a 32-zero-byte `y`, the TCG
/// EK-nonce convention.
pub(crate) fn node_key_template(unique: &[u8; 32]) -> Result<Public, TpmError> {
    // No `with_is_signing_key`: the builder refuses a NULL scheme for it,
    // and the sign attribute above is what makes it a signing key.
    let params = cmd(
        "CreatePrimary",
        PublicEccParametersBuilder::new()
            .with_symmetric(SymmetricDefinitionObject::Null)
            .with_ecc_scheme(EccScheme::Null)
            .with_curve(EccCurve::NistP256)
            .with_key_derivation_function_scheme(KeyDerivationFunctionScheme::Null)
            .build(),
    )?;
    let x = cmd("CreatePrimary", EccParameter::try_from(unique.to_vec()))?;
    let y = cmd("CreatePrimary", EccParameter::try_from(vec![0u8; 32]))?;
    ecc_public(false, params, EccPoint::new(x, y))
}

/// The P-256 signing primary both templates are: SHA-256 names; attributes
/// fixedTPM, fixedParent, sensitiveDataOrigin, userWithAuth, noDA, sign,
/// and `restricted` for the AK.
fn ecc_public(
    restricted: bool,
    params: PublicEccParameters,
    unique: EccPoint,
) -> Result<Public, TpmError> {
    let attributes = cmd(
        "CreatePrimary",
        ObjectAttributesBuilder::new()
            .with_fixed_tpm(true)
            .with_fixed_parent(true)
            .with_sensitive_data_origin(true)
            .with_user_with_auth(true)
            .with_no_da(true)
            .with_restricted(restricted)
            .with_sign_encrypt(true)
            .build(),
    )?;
    cmd(
        "CreatePrimary",
        PublicBuilder::new()
            .with_public_algorithm(PublicAlgorithm::Ecc)
            .with_name_hashing_algorithm(HashingAlgorithm::Sha256)
            .with_object_attributes(attributes)
            .with_ecc_parameters(params)
            .with_ecc_unique_identifier(unique)
            .build(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use tss_esapi::traits::Marshall;

    #[test]
    fn ak_template_is_frozen() {
        let bytes = ak_template().unwrap().marshall().unwrap();
        assert_eq!(
            hex::encode(bytes),
            "0023000b00050472000000100018000b0003001000000000"
        );
    }

    #[test]
    fn node_key_template_is_frozen() {
        let bytes = node_key_template(&[0xAB; 32]).unwrap().marshall().unwrap();
        let expected = format!(
            "0023000b00040472000000100010000300100020{}0020{}",
            "ab".repeat(32),
            "00".repeat(32)
        );
        assert_eq!(hex::encode(bytes), expected);
    }
}
