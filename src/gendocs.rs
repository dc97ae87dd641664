//! `bcd generate-docs --out DIR` (hidden): the man page and the shell
//! completions, generated from the same clap definition that parses the
//! command line, so that they cannot drift from it. `scripts/package` runs
//! it to put them in the Debian package; operators never need it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap_complete::Shell;

#[derive(clap::Args, Debug)]
pub(crate) struct GenerateDocsArgs {
    /// Where to write bcd.1 and the completions (created if missing)
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
}

/// Writes `bcd.1` (with one `bcd-<sub>.1` per subcommand) and `bcd.bash`,
/// `_bcd` (zsh) and `bcd.fish` into `--out`.
pub(crate) fn run(args: GenerateDocsArgs, cmd: clap::Command) -> anyhow::Result<ExitCode> {
    let out = &args.out;
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    write_man_pages(out, cmd.clone())?;
    for (shell, name) in [
        (Shell::Bash, "bcd.bash"),
        (Shell::Zsh, "_bcd"),
        (Shell::Fish, "bcd.fish"),
    ] {
        let mut text = Vec::new();
        clap_complete::generate(shell, &mut cmd.clone(), "bcd", &mut text);
        write(&out.join(name), &text)?;
    }
    Ok(ExitCode::SUCCESS)
}

fn write_man_pages(out: &Path, cmd: clap::Command) -> anyhow::Result<()> {
    let mut text = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut text)
        .context("cannot render the man page")?;
    write(&out.join("bcd.1"), &text)?;
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("bcd-{}", sub.get_name());
        let mut text = Vec::new();
        clap_mangen::Man::new(sub.clone().bin_name(format!("bcd {}", sub.get_name())))
            .title(name.clone())
            .render(&mut text)
            .with_context(|| format!("cannot render the man page of {name}"))?;
        write(&out.join(format!("{name}.1")), &text)?;
    }
    Ok(())
}

fn write(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    std::fs::write(path, bytes).with_context(|| format!("cannot write {}", path.display()))
}
