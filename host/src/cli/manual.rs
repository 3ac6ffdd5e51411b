//! `sluice completions SHELL` and `sluice man`: generated from the command line's own
//! definition, so they never fall behind it.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use clap::CommandFactory;

use super::Cli;
use super::exit::Exit;

/// Prints `shell`'s completion script.
pub(super) fn completions(shell: clap_complete::Shell) -> Result<Exit> {
    // Into a buffer first: clap_complete panics when it cannot write, and a closed
    // stdout is no reason to.
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "sluice", &mut script);
    std::io::stdout().write_all(&script)?;
    Ok(Exit::Success)
}

/// Prints the manual page `sluice(1)`, or with `dir` writes it and one page per command
/// (`sluice-run.1`, ...) there.
pub(super) fn man(dir: Option<&Path>) -> Result<Exit> {
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    let Some(dir) = dir else {
        std::io::stdout().write_all(&main_page(cli)?)?;
        return Ok(Exit::Success);
    };
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let written = |e| anyhow::Error::new(e).context(format!("writing to {}", dir.display()));
    for command in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
        clap_mangen::Man::new(command.clone())
            .generate_to(dir)
            .map_err(written)?;
    }
    std::fs::write(dir.join("sluice.1"), main_page(cli)?).map_err(written)?;
    writeln!(
        std::io::stdout(),
        "wrote sluice.1 and a sluice-COMMAND.1 per command to {}",
        dir.display()
    )?;
    Ok(Exit::Success)
}

/// `sluice(1)`: clap_mangen's sections, with the exit statuses as a section of their
/// own (instead of the `--help` text's table, which roff would run together).
fn main_page(cli: clap::Command) -> std::io::Result<Vec<u8>> {
    let man = clap_mangen::Man::new(cli);
    let mut page = Vec::new();
    man.render_title(&mut page)?;
    man.render_name_section(&mut page)?;
    man.render_synopsis_section(&mut page)?;
    man.render_description_section(&mut page)?;
    man.render_options_section(&mut page)?;
    man.render_subcommands_section(&mut page)?;
    page.extend_from_slice(b".SH \"EXIT STATUS\"\n");
    for exit in Exit::ALL {
        page.extend_from_slice(
            format!(".TP\n\\fB{}\\fR\n{}\n", exit.code(), exit.meaning()).as_bytes(),
        );
    }
    man.render_version_section(&mut page)?;
    Ok(page)
}
