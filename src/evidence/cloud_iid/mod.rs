//! `cloud-iid` evidence: the identity document this VM's cloud signs,
//! fetched from the cloud's metadata service (see the spec's *cloud-iid*).
//!
//! The provider comes from DMI (`/sys/class/dmi/id`, or `BCD_SYSFS_ROOT` in
//! a `failpoints` build); the document from the metadata service at its
//! well-known address, or `[cloud] metadata_url`. Every fetch is bounded in
//! time and size, and every error names the provider and what failed.

pub(crate) mod aws;
pub(crate) mod azure;
pub(crate) mod gcp;

use std::path::Path;
use std::time::Duration;

use bc_wire::cloud_iid::{Evidence, MAX_EVIDENCE_LEN};

/// A whole metadata request, connection included, must be done in this.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// The largest answer read (a GCP identity token is about 1 KiB, Azure's
/// attested document with its certificate about 6 KiB in base64).
const MAX_DOCUMENT_LEN: usize = 14 * 1024;

/// The clouds bcd recognizes from DMI.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Provider {
    Gcp,
    Aws,
    Azure,
}

impl Provider {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Provider::Gcp => "GCP",
            Provider::Aws => "AWS",
            Provider::Azure => "Azure",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum CloudIidError {
    #[error("--attestor cloud-iid: this machine is not a recognized cloud VM (DMI {dmi}: sys_vendor {vendor:?}, product_name {product:?}); cloud-iid knows GCP, AWS and Azure (another issuer's ID token: [cloud] provider = \"oidc:<name>\" and token_file)")]
    NotACloud {
        dmi: String,
        vendor: String,
        product: String,
    },
    #[error("[cloud] token_file {path}: {reason}")]
    TokenFile { path: String, reason: String },
    #[error(
        "{provider}: cannot fetch the identity document from the metadata service {url}: {reason}"
    )]
    Fetch {
        provider: &'static str,
        url: String,
        reason: String,
    },
}

/// The provider of the machine whose sysfs is at `root`.
pub(crate) fn detect(root: &Path) -> Result<Provider, CloudIidError> {
    let dir = root.join("class/dmi/id");
    let read = |name: &str| {
        std::fs::read_to_string(dir.join(name))
            .map(|s| s.trim().chars().take(64).collect::<String>())
            .unwrap_or_default()
    };
    let (vendor, product, bios) = (
        read("sys_vendor"),
        read("product_name"),
        read("bios_vendor"),
    );
    if vendor == "Google" || product == "Google Compute Engine" {
        return Ok(Provider::Gcp);
    }
    if vendor == "Amazon EC2" || bios.starts_with("Amazon EC2") {
        return Ok(Provider::Aws);
    }
    if vendor == "Microsoft Corporation" && product == "Virtual Machine" {
        return Ok(Provider::Azure);
    }
    Err(CloudIidError::NotACloud {
        dmi: dir.display().to_string(),
        vendor,
        product,
    })
}

/// This machine's evidence (`JoinRequest.attestation`): its provider from
/// DMI, its document from the metadata service (`metadata_url` overrides
/// the provider's address), for `audience` (the control plane's api URL).
pub(crate) fn fetch(metadata_url: Option<&str>, audience: &str) -> Result<Vec<u8>, CloudIidError> {
    let provider = detect(&crate::evidence::claims::sysfs_root())?;
    let evidence = match provider {
        Provider::Gcp => Evidence {
            provider: bc_wire::cloud_iid::GCP.to_owned(),
            document: gcp::fetch(metadata_url.unwrap_or(gcp::METADATA_URL), audience)?,
            signature: None,
        },
        Provider::Aws => {
            let (document, signature) = aws::fetch(metadata_url.unwrap_or(aws::METADATA_URL))?;
            Evidence {
                provider: bc_wire::cloud_iid::AWS.to_owned(),
                document,
                signature: Some(signature),
            }
        }
        Provider::Azure => Evidence {
            provider: bc_wire::cloud_iid::AZURE.to_owned(),
            document: azure::fetch(metadata_url.unwrap_or(azure::METADATA_URL), audience)?,
            signature: None,
        },
    }
    .to_json();
    debug_assert!(evidence.len() <= MAX_EVIDENCE_LEN);
    Ok(evidence)
}

/// The evidence of `[cloud] provider = "oidc:<name>"`: the ID token in
/// `token_file`, read whole at each join (a local service rotates it), and
/// never printed: an error names the file and what is wrong, not its text.
pub(crate) fn oidc(config: &crate::config::CloudOidc) -> Result<Vec<u8>, CloudIidError> {
    let err = |reason: String| CloudIidError::TokenFile {
        path: config.token_file.display().to_string(),
        reason,
    };
    let bytes = bc_wire::file::read_regular(
        &config.token_file,
        MAX_DOCUMENT_LEN as u64,
        bc_wire::file::Links::Follow,
    )
    .map_err(|e| err(e.to_string()))?;
    let text = std::str::from_utf8(&bytes)
        .map(str::trim)
        .map_err(|_| err("not UTF-8 text".to_owned()))?;
    if text.is_empty()
        || !text.bytes().all(|b| b.is_ascii_graphic())
        || text.split('.').count() != 3
    {
        return Err(err(
            "not a JWT (three base64url parts separated by '.')".to_owned()
        ));
    }
    let evidence = Evidence {
        provider: config.provider.clone(),
        document: text.to_owned(),
        signature: None,
    }
    .to_json();
    debug_assert!(evidence.len() <= MAX_EVIDENCE_LEN);
    Ok(evidence)
}

/// One GET with `headers`, bounded in time and size; the body as text.
fn get(provider: Provider, url: &str, headers: &[(&str, &str)]) -> Result<String, CloudIidError> {
    request(provider, reqwest::Method::GET, url, headers)
}

/// One request, bounded in time and size; the body as text.
fn request(
    provider: Provider,
    method: reqwest::Method,
    url: &str,
    headers: &[(&str, &str)],
) -> Result<String, CloudIidError> {
    let err = |reason: String| CloudIidError::Fetch {
        provider: provider.name(),
        url: url.to_owned(),
        reason,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| err(format!("cannot start the async runtime: {e}")))?;
    runtime.block_on(async {
        // Never through a proxy: the metadata service is the VM's own.
        let client = crate::http_builder::http_builder()
            .no_proxy()
            .timeout(FETCH_TIMEOUT)
            .connect_timeout(CONNECT_TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| err(e.to_string()))?;
        let mut req = client.request(method, url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let mut resp = req.send().await.map_err(|e| err(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(err(format!("HTTP {}", resp.status())));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| err(e.to_string()))? {
            if body.len() + chunk.len() > MAX_DOCUMENT_LEN {
                return Err(err(format!(
                    "the answer is larger than {MAX_DOCUMENT_LEN} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        // Untrimmed: an AWS document is verified byte for byte.
        String::from_utf8(body).map_err(|_| err("the answer is not UTF-8 text".to_owned()))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dmi(vendor: &str, product: &str, bios: &str) -> tempfile::TempDir {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("class/dmi/id");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("sys_vendor"), format!("{vendor}\n")).unwrap();
        std::fs::write(d.join("product_name"), format!("{product}\n")).unwrap();
        std::fs::write(d.join("bios_vendor"), format!("{bios}\n")).unwrap();
        t
    }

    #[test]
    fn providers_from_dmi() {
        let t = dmi("Google", "Google Compute Engine", "Google");
        assert_eq!(detect(t.path()).unwrap(), Provider::Gcp);
        let t = dmi("Amazon EC2", "m5.large", "Amazon EC2");
        assert_eq!(detect(t.path()).unwrap(), Provider::Aws);
        let t = dmi("Xen", "HVM domU", "Amazon EC2");
        assert_eq!(detect(t.path()).unwrap(), Provider::Aws);
        let t = dmi(
            "Microsoft Corporation",
            "Virtual Machine",
            "Microsoft Corporation",
        );
        assert_eq!(detect(t.path()).unwrap(), Provider::Azure);
        let t = dmi("QEMU", "Standard PC", "SeaBIOS");
        let e = detect(t.path()).unwrap_err().to_string();
        assert!(
            e.contains("not a recognized cloud VM") && e.contains("QEMU"),
            "{e}"
        );
        let empty = tempfile::tempdir().unwrap();
        assert!(detect(empty.path()).is_err());
    }
}
