//! Addressing vectors and answer forms. The Intel addresses of the two
//! test EKs are what tpm2-tools 5.4's `tpm2_getekcertificate -u EK URL`
//! requested from a local server (run by hand on this tree's fixtures);
//! the AMD ones are sha256 prefixes computed apart (Python hashlib) from
//! the form tpm2-tools 5.8 documents (it first addresses AMD).

use super::budget::MAX_IN_FLIGHT;
use super::*;

const RSA_EK: &[u8] = include_bytes!("../testdata/ek-public.bin");
const P256_EK: &[u8] = include_bytes!("../testdata/ek-p256-public.bin");
const EK_CERT: &[u8] = include_bytes!("../testdata/ek-cert.der");

#[test]
fn intel_and_amd_address_an_ek_as_their_services_do() {
    let rsa = Public::parse(RSA_EK).unwrap();
    let p256 = Public::parse(P256_EK).unwrap();
    assert_eq!(
        address(Addressing::Intel, &rsa).unwrap(),
        "ienYnOFNPbJY-U65VxXKs4oym_6d1jAt4q3AWZ0uRFU%3D"
    );
    assert_eq!(
        address(Addressing::Intel, &p256).unwrap(),
        "PH29jczTzMXAO8eCb_6_BZlyH-GbkkTlKvl1Ta8Hq2g%3D"
    );
    assert_eq!(
        address(Addressing::Amd, &rsa).unwrap(),
        "a1933b47422190c8a13ccb74a0dd6033"
    );
    assert_eq!(
        address(Addressing::Amd, &p256).unwrap(),
        "30b22b7480a625d45eb4ec23220aba98"
    );
}

#[test]
fn intel_cannot_address_an_rsa_ek_with_another_exponent() {
    let mut rsa = Public::parse(RSA_EK).unwrap();
    if let KeyParams::Rsa { exponent, .. } = &mut rsa.params {
        *exponent = 3;
    }
    assert!(address(Addressing::Intel, &rsa).is_err());
    assert!(address(Addressing::Amd, &rsa).is_ok());
}

#[test]
fn an_answer_is_der_pem_or_intels_json() {
    assert_eq!(certificate_of(EK_CERT).unwrap(), EK_CERT);
    let pem = format!(
        "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
        base64::engine::general_purpose::STANDARD.encode(EK_CERT)
    );
    assert_eq!(certificate_of(pem.as_bytes()).unwrap(), EK_CERT);
    // Intel's: base64url, padded (its `=` maybe %3D) or not.
    let b64 = base64::engine::general_purpose::URL_SAFE.encode(EK_CERT);
    for cert in [
        b64.clone(),
        b64.replace('=', "%3D"),
        b64.trim_end_matches('=').to_owned(),
    ] {
        let json = format!("{{\"pubhash\":\"ienYnOFNPbJY-U65VxXKs4oym_6d1jAt4q3AWZ0uRFU%3D\",\"certificate\":\"{cert}\"}}");
        assert_eq!(certificate_of(json.as_bytes()).unwrap(), EK_CERT, "{json}");
    }
    for bad in [
        &b"{\"pubhash\":\"x\"}"[..],
        b"{\"certificate\":\"!!!\"}",
        b"{not json",
        b"<html>no</html>",
        b"",
        b"-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
    ] {
        assert!(
            certificate_of(bad).is_err(),
            "{}",
            String::from_utf8_lossy(bad)
        );
    }
}

#[test]
fn services_are_found_by_manufacturer_and_urls_checked() {
    let c = EkServicesConfig::default();
    assert_eq!(
        c.service_for(u32::from_be_bytes(*b"INTC"))
            .unwrap()
            .addressing,
        Addressing::Intel
    );
    assert_eq!(
        c.service_for(u32::from_be_bytes(*b"AMD\0"))
            .unwrap()
            .addressing,
        Addressing::Amd
    );
    assert!(c.service_for(u32::from_be_bytes(*b"IBM\0")).is_none());
    assert!(c.service_for(0).is_none());
    assert_eq!(manufacturer_text(u32::from_be_bytes(*b"AMD\0")), "AMD");
    assert_eq!(manufacturer_text(u32::from_be_bytes(*b"IBM ")), "IBM");
    assert_eq!(manufacturer_text(0x0a41_0000), "?A");

    for url in [
        default_url(Addressing::Intel),
        default_url(Addressing::Amd),
        "",
    ] {
        check_url(url).unwrap();
    }
    for bad in [
        "http://ekop.intel.com/{ek}",
        "https://ekop.intel.com/",
        "https://ekop.intel.com/{ek}/{ek}",
        "https:///{ek}",
        "https://{ek}/",
        "https://{ek}.intel.com/x",
    ] {
        assert!(check_url(bad).is_err(), "{bad}");
    }
}

/// Past the fetches at once, a fetch is refused before any connection;
/// a fetch that ends gives its place back.
#[test]
fn fetches_at_once_are_bounded() {
    let s = EkServices::new(EkServicesConfig::default());
    let src = Source::of(None);
    let held: Vec<_> = (0..MAX_IN_FLIGHT)
        .map(|_| s.enter(src, Claim::Known).unwrap())
        .collect();
    assert!(matches!(
        s.enter(src, Claim::Known),
        Err(FetchError::Busy(_))
    ));
    drop(held);
    assert!(s.enter(src, Claim::Known).is_ok());
}
