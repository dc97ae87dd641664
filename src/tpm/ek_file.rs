//! `[tpm] ek_certificate`: an EK certificate an operator put on the machine
//! for a TPM whose NV holds none (the maker's download, a server vendor's
//! delivery manifest). When set it is sent instead of NV's certificate: the
//! operator named it on purpose (NV's may be missing, expired or replaced
//! by a re-issued one). It must be the certificate of this TPM's EK; bcd
//! checks that when it loads the EK ([`super::Tpm::ek`]), before anything
//! is sent.

use std::path::{Path, PathBuf};

use super::{EkKind, TpmError};

/// Larger than any EK certificate (they are 1-2 KiB); bounds the read.
const MAX_FILE: u64 = 64 * 1024;

/// Where an EK certificate bcd sends came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum CertificateSource {
    /// The TPM's EK certificate NV index.
    Nv,
    /// `[tpm] ek_certificate`.
    OperatorFile,
}

/// A parsed `[tpm] ek_certificate`.
#[derive(Clone, Debug)]
pub(crate) struct OperatorCertificate {
    pub path: PathBuf,
    /// One DER certificate.
    pub der: Vec<u8>,
    /// The EK its key is (RSA-2048, P-256 or P-384).
    pub kind: EkKind,
}

impl OperatorCertificate {
    /// Reads one certificate, PEM (one CERTIFICATE block) or DER, whose key
    /// is an EK's; anything else is an error naming the file and why.
    pub(crate) fn read(path: &Path) -> Result<Self, TpmError> {
        let bad = |why: String| TpmError::OperatorCertificate {
            path: path.to_owned(),
            why,
        };
        // Only the file itself (no link, FIFO or device), and only so much
        // of it: a wrong path must fail promptly, not hang or fill memory.
        let bytes = bc_wire::file::read_regular(path, MAX_FILE, bc_wire::file::Links::Refuse)
            .map_err(|e| match e {
                bc_wire::file::FileError::TooLarge(_) => {
                    bad(format!("{e}; an EK certificate is a few KiB"))
                }
                e => bad(e.to_string()),
            })?;
        let der = parse(&bytes).map_err(bad)?;
        let kind = EkKind::of_certificate(&der).ok_or_else(|| {
            bad("its key is not an EK's (RSA-2048, NIST P-256 or P-384)".to_owned())
        })?;
        Ok(OperatorCertificate {
            path: path.to_owned(),
            der,
            kind,
        })
    }
}

/// One DER certificate from PEM text (exactly one CERTIFICATE block) or DER
/// (nothing after it).
fn parse(bytes: &[u8]) -> Result<Vec<u8>, String> {
    use x509_parser::prelude::FromDer;
    let der = if bytes.first() == Some(&0x30) {
        bytes.to_vec()
    } else {
        let mut blocks = Vec::new();
        for item in rustls_pemfile::read_all(&mut &bytes[..]) {
            match item {
                Ok(rustls_pemfile::Item::X509Certificate(der)) => blocks.push(der.to_vec()),
                Ok(_) => return Err("it holds a PEM block other than CERTIFICATE".to_owned()),
                Err(e) => return Err(format!("bad PEM: {e}")),
            }
        }
        match blocks.len() {
            1 => blocks.remove(0),
            0 => return Err("it is neither a DER certificate nor PEM with a CERTIFICATE block".to_owned()),
            n => return Err(format!("it holds {n} certificates; put only the EK certificate in it (its issuers go in [tpm] ek_intermediates)")),
        }
    };
    match x509_parser::certificate::X509Certificate::from_der(&der) {
        Ok(([], _)) => Ok(der),
        Ok(_) => Err("bytes follow the DER certificate".to_owned()),
        Err(e) => Err(format!("not an X.509 certificate: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pem_or_der_one_ek_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, bytes: &[u8]| {
            let p = dir.path().join(name);
            std::fs::write(&p, bytes).unwrap();
            p
        };
        let real =
            include_bytes!("../../wire/src/ekcert/testdata/real/stm-st33htph-rsa-ek-intca05.pem");
        let c = OperatorCertificate::read(&write("ek.pem", real)).unwrap();
        assert_eq!(c.kind, EkKind::Rsa);
        let der = write("ek.der", &c.der);
        assert_eq!(OperatorCertificate::read(&der).unwrap().der, c.der);
        let ecc = include_bytes!(
            "../../wire/src/ekcert/testdata/real/stm-st33htph-ecc-ek-eccintca01.pem"
        );
        assert_eq!(
            OperatorCertificate::read(&write("ecc.pem", ecc))
                .unwrap()
                .kind,
            EkKind::EccP256
        );
        let err = |p: PathBuf| OperatorCertificate::read(&p).unwrap_err().to_string();
        let two = [&real[..], &real[..]].concat();
        assert!(err(write("two.pem", &two)).contains("holds 2 certificates"));
        assert!(err(write("junk", b"hello\n")).contains("neither a DER certificate nor PEM"));
        let mut trailing = c.der.clone();
        trailing.push(0);
        assert!(err(write("trailing.der", &trailing)).contains("bytes follow"));
        let e = err(dir.path().join("missing"));
        assert!(
            e.starts_with("[tpm] ek_certificate ") && e.contains("cannot read it"),
            "{e}"
        );
        let big = write("big.pem", &vec![b'x'; MAX_FILE as usize + 1]);
        assert!(err(big).contains("larger than 65536 bytes; an EK certificate is a few KiB"));
        let link = dir.path().join("link.pem");
        std::os::unix::fs::symlink(dir.path().join("ek.pem"), &link).unwrap();
        assert!(err(link).contains("symbolic link"));
    }
}
