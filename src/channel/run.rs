//! Running accepted commands: at most [`MAX_RUNNING`] at once (the others
//! wait for a slot in arrival order: the semaphore is fair), each on a
//! blocking thread, cut off at its kind's deadline (`failed`, `deadline`).
//!
//! [`MAX_RUNNING`]: bc_wire::command::MAX_RUNNING
use std::sync::Arc;
use std::time::Duration;

use bc_wire::command::{RunnableCommand, Times};
use bc_wire::command_v1::CommandResult;
use tokio::sync::{mpsc, Semaphore};

use super::now_ms;
use crate::commands::{self, Done, Machine};

/// The kinds' code: [`commands::run`], or a test's stand-in.
#[derive(Clone)]
pub(super) struct Runner {
    run: Arc<RunFn>,
    /// A test's deadline for every kind (the registry's otherwise).
    deadline: Option<Duration>,
}

type RunFn = dyn Fn(&RunnableCommand, &Machine) -> Done + Send + Sync;

impl Runner {
    pub(super) fn kinds() -> Runner {
        Runner {
            run: Arc::new(commands::run),
            deadline: None,
        }
    }

    #[cfg(test)]
    pub(super) fn with(
        f: impl Fn(&RunnableCommand, &Machine) -> Done + Send + Sync + 'static,
        deadline: Option<Duration>,
    ) -> Runner {
        Runner {
            run: Arc::new(f),
            deadline,
        }
    }
}

/// Runs `command` when a slot is free; its result goes to `done`.
pub(super) fn start(
    command: RunnableCommand,
    slots: Arc<Semaphore>,
    machine: Arc<Machine>,
    runner: Runner,
    done: mpsc::UnboundedSender<CommandResult>,
) {
    tokio::spawn(async move {
        // The semaphore is never closed; if it were, the command runs anyway.
        let _slot = slots.acquire_owned().await.ok();
        let started_ms = now_ms();
        let kind = command.kind();
        let deadline = runner.deadline.unwrap_or(Duration::from_millis(
            u64::try_from(kind.deadline_ms).unwrap_or(0),
        ));
        let command = Arc::new(command);
        let running = command.clone();
        let work = tokio::task::spawn_blocking(move || (runner.run)(&running, &machine));
        let done_now = match tokio::time::timeout(deadline, work).await {
            Ok(Ok(d)) => d,
            Ok(Err(e)) => Done::failed(format!("the kind's code stopped: {e}")),
            // The thread cannot be cut; its answer, when it comes, is dropped.
            Err(_) => Done::failed(format!(
                "deadline: {} did not finish within {:?}",
                kind.name, deadline
            )),
        };
        let result = command.result(
            done_now.status,
            &done_now.outcome,
            done_now.output,
            Times {
                started_ms,
                finished_ms: now_ms(),
            },
        );
        // The channel is gone only when bcd stops.
        let _ = done.send(result);
    });
}
