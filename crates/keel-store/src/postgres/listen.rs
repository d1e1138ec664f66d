//! Wake-ups between nodes over Postgres `LISTEN/NOTIFY`: one connection per node
//! listening on the channel `keel_wake`, kept open (and reopened with backoff when the
//! database restarts); each notification's payload is a run id.

use std::time::Duration;

use keel_types::RunId;
use tokio::sync::broadcast;
use tokio_postgres::AsyncMessage;

/// The channel every node listens on.
pub(crate) const CHANNEL: &str = "keel_wake";

/// How many wake-ups wait for the kernel before the oldest are dropped (waiters poll as
/// well, so a dropped one only delays).
const BACKLOG: usize = 4096;

/// Starts the listening task, for the life of the process (a node listens as long as it
/// runs); wake-ups arrive on the returned sender's receivers.
pub(crate) fn start(config: tokio_postgres::Config) -> broadcast::Sender<RunId> {
    let (sender, _) = broadcast::channel(BACKLOG);
    let wakes = sender.clone();
    tokio::spawn(async move {
        let mut backoff = Duration::from_millis(100);
        loop {
            match listen(&config, &wakes).await {
                Ok(()) => backoff = Duration::from_millis(100),
                Err(err) => {
                    tracing::warn!("listening for wake-ups from other nodes failed (retrying): {err}")
                }
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(5));
        }
    });
    sender
}

/// One listening connection, until it fails.
async fn listen(
    config: &tokio_postgres::Config,
    wakes: &broadcast::Sender<RunId>,
) -> Result<(), tokio_postgres::Error> {
    let (client, mut connection) = config.connect(tokio_postgres::NoTls).await?;
    let (messages_tx, mut messages) = tokio::sync::mpsc::unbounded_channel();
    // The connection is driven here; notifications come out of it as messages.
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(message)) => {
                    if messages_tx.send(message).is_err() {
                        return Ok(());
                    }
                }
                Some(Err(err)) => return Err(err),
                None => return Ok(()),
            }
        }
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    while let Some(message) = messages.recv().await {
        if let AsyncMessage::Notification(notification) = message
            && let Ok(run) = RunId::parse(notification.payload())
        {
            let _ = wakes.send(run);
        }
    }
    drop(client);
    match driver.await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}
