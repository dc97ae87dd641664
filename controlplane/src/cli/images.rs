//! `images add|list|remove`: the OS images `deploy.image` writes to a
//! machine's disk (served to commissioning ramdisks at
//! `GET /v1/images/<name>`; docs/deploy.md).

use std::path::PathBuf;

use anyhow::{Context, Result};
use bc_controlplane::deploy::{self, Image};
use bc_controlplane::store;
use clap::Subcommand;
use serde_json::json;

use super::{open_db, print_line, print_list, ListArgs};

#[derive(Subcommand)]
pub(crate) enum ImagesCmd {
    /// Store an image (raw, or zstd-compressed: detected by its magic) in
    /// DIR/images and record the SHA-256 and size of its raw bytes, which
    /// `deploy.image` pins. A zstd stream is decoded whole first: one that
    /// does not decode is refused and nothing is kept.
    Add {
        #[command(flatten)]
        dir: super::Dir,
        /// Replace an image of the same name.
        #[arg(long)]
        replace: bool,
        #[arg(long)]
        json: bool,
        /// The image's name: 1-64 of a-z 0-9 . _ - (not starting with .).
        name: String,
        /// The image file.
        file: PathBuf,
    },
    /// List the images.
    List(ListArgs),
    /// Remove an image (and its file).
    Remove {
        #[command(flatten)]
        dir: super::Dir,
        name: String,
    },
}

fn image_json(i: &Image) -> serde_json::Value {
    json!({
        "name": i.name,
        "sha256": i.sha256,
        "bytes": i.bytes,
        "compression": i.compression,
        "storedBytes": i.stored_bytes,
        "storedSha256": i.stored_sha256,
        "createdAt": store::rfc3339(i.created_at),
    })
}

fn image_line(i: &Image) -> String {
    format!(
        "{} sha256 {} bytes {} compression {} stored {}",
        i.name, i.sha256, i.bytes, i.compression, i.stored_bytes
    )
}

pub(crate) fn run(cmd: ImagesCmd) -> Result<()> {
    match cmd {
        ImagesCmd::Add {
            dir,
            replace,
            json,
            name,
            file,
        } => {
            let db = open_db(&dir.dir)?;
            let image = deploy::add(&dir.dir, &db, &name, &file, replace)
                .with_context(|| format!("cannot add image {name}"))?;
            if json {
                print_line(&serde_json::to_string_pretty(&image_json(&image))?)
            } else {
                print_line(&format!("added {}", image_line(&image)))
            }
        }
        ImagesCmd::List(args) => {
            let db = open_db(&args.dir.dir)?;
            let images = deploy::list(&db).context("cannot list images")?;
            print_list(&images, args.json, image_json, |i| Ok(image_line(i)))
        }
        ImagesCmd::Remove { dir, name } => {
            let db = open_db(&dir.dir)?;
            let image = deploy::remove(&dir.dir, &db, &name)
                .with_context(|| format!("cannot remove image {name}"))?;
            print_line(&format!("removed {}", image.name))
        }
    }
}
