"""The MLflow store: checked before any work, created atomically, written one process at a time.

Before any work, :func:`check_store` refuses a store MLflow would fail on or damage: a server that
does not answer (MLflow's own client would retry for minutes), a file that is not SQLite, another
application's database (MLflow would add its tables to it), a store left half-migrated. A new SQLite
store is created beside its path and renamed into place, so an interrupted first run leaves none.

Many processes may write one SQLite file: every write takes an exclusive file lock next to the
database (one writer at a time) and first makes sure no other program holds SQLite's own lock (MLflow
would wait 20 s on it, per call, and print SQLAlchemy's traceback); a write that meets ``database is
locked`` is retried with backoff, then fails (:class:`StoreLocked`) with a message that points at
``tracking=server``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import socket
import sqlite3
import ssl
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, TypeVar

from pipeline import stops
from pipeline.errors import ConfigError
from pipeline.config.paths import writable_problem

log = logging.getLogger(__name__)

T = TypeVar("T")


def server_command(host: str, port: int, listen: Optional[str] = None) -> str:
    """The ``mlflow server`` command of docs/scaling-out.md for clients that reach it as ``host:port``: a store of
    its own, artifacts uploaded through it into a folder beside that store, ``host:port`` among the hosts it
    answers (MLflow's ``--allowed-hosts``, by default localhost and private addresses only) and its own UI there among
    the origins whose browser requests it takes (``--cors-allowed-origins``, by default localhost's only: the UI at
    ``http://host:port`` would list no run)."""
    return (f"mlflow server --backend-store-uri sqlite:///mlflow-server/mlflow.db --serve-artifacts "
            f"--artifacts-destination mlflow-server/artifacts --host {listen or host} --port {port} "
            f"--allowed-hosts {host}:{port},localhost:{port} --cors-allowed-origins http://{host}:{port}")


SERVER_HINT = ("many processes writing one SQLite file: run a tracking server instead (docs/scaling-out.md), e.g.\n"
               f"  {server_command('HOST', 5000, listen='0.0.0.0')}\n"
               "  python -m pipeline -m tracking=server tracking.uri=http://HOST:5000 ...  (conf/tracking/server.yaml)")
# What MLflow's server answers (403) to a request whose Host it does not allow (mlflow.server.security_utils).
REFUSED_HOST = "Invalid Host header"
# MLflow's experiment-kind tag: tweakpipe's runs are model runs to compare, not GenAI traces.
EXPERIMENT_KIND = ("mlflow.experimentKind", "custom_model_development")
# The experiment's primary metric (MLflow's tags; the UI's charts always include it): the routed model's speed-up over
# eager, one figure per run whatever its batch sizes (pipeline.route.figures). A primary metric already set is left.
PRIMARY_METRIC = {"mlflow.experiment.primaryMetric.name": "speedup_vs_eager/geomean",
                  "mlflow.experiment.primaryMetric.greaterIsBetter": "true"}
# Tables every MLflow SQLite store has; a database with tables but not these belongs to something else.
MLFLOW_TABLES = {"alembic_version", "experiments", "runs"}
# A probe of the server waits this long; MLflow's own client retries a dead server for minutes.
PROBE_TIMEOUT_S = 5.0


def sqlite_path(uri: str) -> Optional[Path]:
    """The database file of a ``sqlite:///`` URI, or None for a server."""
    return Path(uri[len("sqlite:///"):]).expanduser() if uri.startswith("sqlite:///") else None


# How long a read-only check waits on a store a writer holds before it leaves that store to the guard, whose wait
# is the run's (``tracking.max_wait_s``): a longer one here made a run wait for seconds no setting named (each of
# three checks waited 10 s, so a 1 s ``max_wait_s`` gave up after 30 s).
READ_WAIT_S = 0.5


def read_only(db: Path) -> sqlite3.Connection:
    """A connection to ``db`` that cannot write a byte (SQLite's read-only mode), waiting at most
    :data:`READ_WAIT_S` on a writer's lock."""
    return sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True, timeout=READ_WAIT_S)


def sqlite_tables(db: Path) -> Optional[Set[str]]:
    """The table names of a SQLite file, read without writing a byte; None if it is not SQLite."""
    try:
        con = read_only(db)
    except sqlite3.Error:
        return None
    try:
        return {row[0] for row in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.OperationalError as exc:
        if is_locked_error(exc):
            raise  # a writer holds it: that says nothing about what the file is
        return None
    except sqlite3.DatabaseError:
        return None
    finally:
        con.close()


SQLITE_MAGIC = b"SQLite format 3\x00"


def sqlite_header(db: Path) -> bytes:
    """The first 100 bytes of ``db``: SQLite's header, where it is a SQLite file."""
    with db.open("rb") as f:
        return f.read(100)


def sqlite_damage(db: Path) -> Optional[str]:
    """How a SQLite file is damaged (cut short, malformed pages), read without writing a byte, or None."""
    header = sqlite_header(db)
    page = int.from_bytes(header[16:18], "big") or 65536  # 1 stands for 65536
    pages, counter, valid_for = (int.from_bytes(header[i:i + 4], "big") for i in (28, 24, 92))
    if pages and counter == valid_for and db.stat().st_size < pages * page:
        return f"it is cut short: {db.stat().st_size} bytes of the {pages * page} its header records"
    con = read_only(db)
    try:
        rows = [row[0] for row in con.execute("PRAGMA quick_check")]
    except sqlite3.OperationalError as exc:
        if is_locked_error(exc):
            return None  # a writer holds it; the writer's store is the one that is checked
        return str(exc)
    except sqlite3.DatabaseError as exc:
        return str(exc)
    finally:
        con.close()
    lines = [line.strip() for row in rows for line in str(row).splitlines() if line.strip() and "***" not in line]
    return None if rows == ["ok"] else "; ".join(lines[:3])


def schema_problem(db: Path, tables: Set[str]) -> Optional[str]:
    """Why this MLflow would migrate ``db`` on opening it (tables missing, another schema revision), or None."""
    try:
        from mlflow.store.db.base_sql_model import Base
        from mlflow.store.db.utils import _get_latest_schema_revision
        import mlflow.store.tracking.dbmodels.models  # noqa: F401 -- registers the tables on Base
    except ImportError:  # another MLflow layout: MLflow's own check then speaks
        return None
    con = read_only(db)
    try:
        found = [row[0] for row in con.execute("SELECT version_num FROM alembic_version")]
    except sqlite3.DatabaseError as exc:
        if is_locked_error(exc):
            return None  # a writer holds it: the store guard waits for it, and MLflow checks the schema then
        found = []
    finally:
        con.close()
    import mlflow

    head = _get_latest_schema_revision()
    missing = sorted(set(Base.metadata.tables) - tables)
    if found == [head] and not missing:
        return None
    return (f"{db} is an MLflow store of another schema (revision {', '.join(found) or 'none'}"
            f"{', lacking tables ' + ', '.join(missing[:3]) if missing else ''}; MLflow {mlflow.__version__} uses "
            f"{head}), and opening it would migrate it; it was left unchanged. Back it up, then run "
            f"mlflow db upgrade sqlite:///{db} (or use the MLflow version that wrote it)")


def sqlite_problem(db: Path, reading: bool = False) -> Optional[str]:
    """Why MLflow must not open ``db`` as its store (it would fail, or change another program's file), or None.

    ``reading`` (the report) also refuses what a run would create or migrate: a missing or empty file,
    a database without MLflow's tables, a store of another schema revision. Nothing here writes a byte."""
    fresh = "point tracking.uri at a new file, e.g. tracking.uri=sqlite:///outputs/mlflow.db"
    if reading:
        fresh = "pass the store a run wrote, e.g. --uri sqlite:///outputs/mlflow.db"
    if not db.exists():
        return f"no MLflow store at {db}; {fresh}" if reading else folder_problem(db, fresh)
    if not db.is_file():
        return f"{db} is not a file; {fresh}"
    if not db.stat().st_size:
        return f"{db} is empty, so it holds no MLflow store; it was left unchanged; {fresh}" if reading \
            else folder_problem(db, fresh)
    if not sqlite_header(db).startswith(SQLITE_MAGIC):
        return f"{db} is not a SQLite database, so it is no MLflow store; it was left unchanged; {fresh}"
    try:
        damage, tables = sqlite_damage(db), sqlite_tables(db)
    except sqlite3.OperationalError:
        return None  # a writer holds it now: the store guard waits for it
    if damage or tables is None:
        return (f"{db} is a damaged SQLite database ({damage or 'its table list cannot be read'}); it was left "
                f"unchanged. Restore it from a backup (sqlite3 {db} .recover may save its runs), or {fresh}")
    leftovers = sorted(t for t in tables if t.startswith("_alembic_tmp_"))
    if leftovers:
        return (f"{db} holds {leftovers[0]}, left by an interrupted MLflow migration, so MLflow cannot open it. "
                f"If its runs do not matter delete it (rm {db}); else back it up, run "
                f"sqlite3 {db} 'DROP TABLE {leftovers[0]}' and then mlflow db upgrade sqlite:///{db}")
    if tables and not MLFLOW_TABLES <= tables:
        shown = ", ".join(sorted(tables)[:5]) + (", ..." if len(tables) > 5 else "")
        return (f"{db} is another application's SQLite database (tables {shown}), not an MLflow store: MLflow "
                f"would add its own tables to it; it was left unchanged; {fresh}")
    if not tables:
        return f"{db} is a SQLite database without tables, so it holds no MLflow store; {fresh}" if reading \
            else folder_problem(db, fresh)
    problem = schema_problem(db, tables)
    if problem or reading:
        return problem
    if not os.access(db, os.W_OK):
        return f"{db} cannot be written (read-only); make it writable, or {fresh}"
    return folder_problem(db, fresh)


def folder_problem(db: Path, fresh: str) -> Optional[str]:
    """Why a run cannot write the store ``db`` where it lies (its folder, where SQLite writes its journal and a new
    store is made, or the lock every writer takes: another user's, left unwritable), naming the fix, or None."""
    problem = writable_problem(db.parent)
    if problem:
        return f"{problem}; make it writable, or {fresh}"
    lock = lock_path(db)
    if lock.exists() and not os.access(lock, os.W_OK):
        return (f"{lock} cannot be written (another user's run left it?), and every process that writes this store "
                f"takes it: make it writable for everyone who writes the store (chmod g+w or a+w), or {fresh}")
    return None


def lock_path(db: Path) -> Path:
    """The file every writer of the SQLite store ``db`` locks (``flock``) while it writes: ``<db>.lock``."""
    return db.with_name(db.name + ".lock")


def server_problem(uri: str) -> Optional[str]:
    """Why the tracking server at ``uri`` cannot be used, or None: it does not answer within seconds, or it refuses
    the name ``uri`` reaches it by (MLflow answers ``/health`` to any name, its API only to the allowed hosts, so an
    API path is asked too). The probes leave out the URL's credentials (``http://USER:PASSWORD@HOST``), which urllib
    cannot take and MLflow sends itself; a server that asks for them has answered."""
    where = urllib.parse.urlsplit(uri)
    host = where.netloc.rpartition("@")[2]
    base = where._replace(netloc=host).geturl().rstrip("/")
    port = where.port or (443 if where.scheme == "https" else 80)
    try:
        urllib.request.urlopen(f"{base}/health", timeout=PROBE_TIMEOUT_S).close()
        urllib.request.urlopen(f"{base}/api/2.0/mlflow/experiments/get-by-name?experiment_name=Default",
                               timeout=PROBE_TIMEOUT_S).close()
    except urllib.error.HTTPError as exc:
        if exc.code == 403 and REFUSED_HOST in exc.read(500).decode("utf-8", "replace"):
            return (f"the tracking server at {base} refuses requests addressed to {host} (MLflow's "
                    f"--allowed-hosts: by default localhost and private addresses only); start it with "
                    f"--allowed-hosts {where.hostname}:{port} (every name:port clients use, comma-separated), e.g. "
                    f"{server_command(where.hostname or 'HOST', port, listen='0.0.0.0')}")
        return None  # it answered
    except (urllib.error.URLError, OSError) as exc:
        if isinstance(getattr(exc, "reason", None), ssl.SSLError):
            return None  # it answered, in TLS this probe does not verify as MLflow may be told to
        return (f"the tracking server is unreachable ({getattr(exc, 'reason', exc)}); start one with "
                f"{server_command(where.hostname or 'HOST', where.port or 5000)}, or run with tracking=sqlite or "
                f"tracking=off")
    return None


def check_store(uri: str, reading: bool = False) -> None:
    """Refuse, before any work and changing nothing, a store MLflow would fail on or damage; ``reading``
    (the report), also one it would create or migrate."""
    db = sqlite_path(uri)
    if db is not None:
        problem = sqlite_problem(db, reading)
    elif uri.startswith(("http://", "https://")):
        problem = server_problem(uri)
    elif uri.startswith("file:") or "://" not in uri:
        problem = "use sqlite:///path/to/mlflow.db or a server URL (http://host:port); MLflow refuses the plain-file store"
    else:
        problem = None
    if problem:
        raise ConfigError(f"tracking.uri={uri}: {problem}")


def create_sqlite_store(db: Path) -> None:
    """MLflow's tables, made in ``<db>.creating`` and renamed to ``db``: an interrupted creation
    leaves no half-migrated store, only a file the next creation removes. Call under the store's lock."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    db.parent.mkdir(parents=True, exist_ok=True)
    for stale in db.parent.glob(db.name + ".creating*"):  # an earlier creation, interrupted
        stale.unlink()
    tmp = db.with_name(db.name + ".creating")
    store = SqlAlchemyStore(f"sqlite:///{tmp}", (db.parent.resolve() / "mlartifacts").as_uri())
    store.engine.dispose()
    os.replace(tmp, db)


def is_locked_error(exc: BaseException) -> bool:
    """SQLite's busy error, however MLflow or SQLAlchemy wrapped it."""
    text = f"{exc} {exc.__cause__ or ''} {exc.__context__ or ''}".lower()
    return "database is locked" in text or "database table is locked" in text


class StoreLocked(RuntimeError):
    """The store stayed locked by other writers for longer than the guard waits."""


def sqlite_writable_now(db: Path) -> None:
    """Raise SQLite's busy error at once where another program holds ``db`` (a writer, or a reader in a long
    transaction: neither takes tweakpipe's ``<db>.lock``), so that the guard waits for it by its own clock and
    MLflow never meets the lock: it would wait 20 s on every call (its ``busy_timeout``), whatever
    ``tracking.max_wait_s`` says, then print SQLAlchemy's traceback. Takes SQLite's exclusive lock and drops it,
    writing nothing; a store not made yet is left to its creation."""
    if not db.is_file():
        return
    con = sqlite3.connect(f"{db.resolve().as_uri()}?mode=rw", uri=True, timeout=0, isolation_level=None)
    try:
        con.execute("BEGIN EXCLUSIVE")
        con.execute("ROLLBACK")
    finally:
        con.close()


class StoreGuard:
    """Runs store writes one at a time across processes (SQLite) and retries a locked database.

    A server URI needs neither: the guard then just calls through.
    """

    def __init__(self, uri: str, max_wait_s: float = 120.0) -> None:
        db = sqlite_path(uri)
        self.uri, self.db = uri, db
        self.lock_path = lock_path(db) if db is not None else None
        self.max_wait_s = max_wait_s

    @contextlib.contextmanager
    def exclusive(self, deadline: float) -> Iterator[None]:
        """An exclusive ``flock`` on ``<db>.lock``, polled with backoff until ``deadline``."""
        if self.lock_path is None:
            yield
            return
        import fcntl

        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.lock_path, "a") as fh:
            delay = 0.01
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreLocked(f"MLflow store {self.uri}: another process held {self.lock_path} "
                                          f"for more than {self.max_wait_s:.0f}s; {SERVER_HINT}") from None
                    time.sleep(delay * random.uniform(1.0, 2.0))
                    delay = min(delay * 2, 1.0)
            try:
                with stops.deferred():  # a stop raised between SQLite's insert and commit would keep it locked
                    sqlite_writable_now(self.db)
                    yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def __call__(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        deadline = time.monotonic() + self.max_wait_s
        delay = 0.1
        while True:
            try:
                with self.exclusive(deadline):
                    return fn(*args, **kwargs)
            except Exception as exc:
                if not is_locked_error(exc):
                    raise
                if time.monotonic() > deadline:
                    raise StoreLocked(f"MLflow store {self.uri} stayed locked for more than "
                                      f"{self.max_wait_s:.0f}s; {SERVER_HINT}") from exc
                log.debug("mlflow: %s is locked; retrying in %.1fs", self.uri, delay)  # one warning if it stays so
                time.sleep(delay * random.uniform(1.0, 2.0))
                delay = min(delay * 2, 5.0)


def experiment_tags() -> Dict[str, str]:
    """The tags of an experiment tweakpipe creates: its kind and its primary metric."""
    return {EXPERIMENT_KIND[0]: EXPERIMENT_KIND[1], **PRIMARY_METRIC}


def open_experiment(uri: str, name: str, guard: StoreGuard) -> str:
    """The experiment's id, created if missing, marked with :data:`EXPERIMENT_KIND` unless it has a kind and with
    :data:`PRIMARY_METRIC` unless it has one.

    A SQLite store keeps its artifacts beside the database (``<db dir>/mlartifacts``) instead of
    MLflow's default ``./mlruns`` under whatever directory the job started in.
    """
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    check_store(uri)
    db = sqlite_path(uri)

    def get_or_create() -> str:  # under the guard: a fresh SQLite store is created (migrated) by one process
        if db is not None and not MLFLOW_TABLES <= (sqlite_tables(db) or set()):
            create_sqlite_store(db)
        if db is not None:
            repair_moved_artifacts(db)
        client = MlflowClient(tracking_uri=uri)
        found = client.get_experiment_by_name(name)
        if found is not None:
            missing = {} if EXPERIMENT_KIND[0] in found.tags else dict([EXPERIMENT_KIND])  # an earlier tweakpipe's,
            if next(iter(PRIMARY_METRIC)) not in found.tags:  # or one made by hand
                missing.update(PRIMARY_METRIC)
            for key, value in missing.items():
                client.set_experiment_tag(found.experiment_id, key, value)
            return found.experiment_id
        location = (db.parent.resolve() / "mlartifacts").as_uri() if db is not None else None
        try:
            return client.create_experiment(name, artifact_location=location, tags=experiment_tags())
        except MlflowException:  # created meanwhile by another process sharing a server
            found = client.get_experiment_by_name(name)
            if found is None:
                raise
            return found.experiment_id

    return guard(get_or_create)


def artifact_root(db: Path) -> str:
    """Where a SQLite store keeps its artifacts: ``mlartifacts`` beside the database, as a file URI."""
    return (db.parent.resolve() / "mlartifacts").as_uri()


def copied_from(db: Path, folder_uri: str, new: str) -> bool:
    """Whether ``db`` is a copy of the store whose artifacts lie in ``<folder_uri>/mlartifacts``: that folder
    still holds its own database of the same name, or the experiment's artifacts came along beside ``db``."""
    other = Path(urllib.parse.urlsplit(folder_uri).path) / db.name
    return Path(urllib.parse.urlsplit(new).path).is_dir() or (other.is_file() and not os.path.samefile(other, db))


def repair_moved_artifacts(db: Path) -> List[str]:
    """Point experiments whose artifacts tweakpipe placed beside another database at ``mlartifacts`` beside this one.

    MLflow stores absolute artifact locations. A project (and its ``outputs/``) moved to another folder
    would send new artifacts to a path that is gone and leave old ones unreachable; one copied (then
    moved) would send them into the original project's ``mlartifacts``, whose store does not know them.
    A location of tweakpipe's shape (``<folder>/mlartifacts/<experiment>``) elsewhere than beside this
    database is rewritten where it no longer exists or where this store is a copy of the one in that
    folder (:func:`copied_from`); a store file moved alone keeps its artifacts where they are, and any
    other location was chosen by someone else and is left as it is. Returns the experiments repaired.
    """
    root = artifact_root(db)
    repaired = []
    con = sqlite3.connect(db)
    try:
        with con:
            for exp_id, location in con.execute("SELECT experiment_id, artifact_location FROM experiments").fetchall():
                old = str(location or "")
                tail = old.rstrip("/").rsplit("/mlartifacts", 1)
                if not old.startswith("file://") or old.startswith(root + "/") or len(tail) != 2:
                    continue  # beside this database already, or not a location tweakpipe chose: leave it
                new = root + tail[1]
                gone = not Path(urllib.parse.urlsplit(old).path).exists()
                if new == old.rstrip("/") or not (gone or copied_from(db, tail[0], new)):
                    continue
                con.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?", (new, exp_id))
                con.execute("UPDATE runs SET artifact_uri = ? || substr(artifact_uri, ?) "
                            "WHERE experiment_id = ? AND artifact_uri LIKE ? || '%'",
                            (new, len(old) + 1, exp_id, old))
                repaired.append(str(exp_id))
                log.warning("mlflow: experiment %s kept its artifacts at %s, %s; its artifact paths now point at %s",
                            exp_id, old, "which no longer exists (the store was moved?)" if gone else
                            "beside another store (this one was copied from it)", new)
    finally:
        con.close()
    return repaired


def process_started(pid: int) -> str:
    """When process ``pid`` started (clock ticks since boot, from /proc), or "" where that is unknown:
    with the pid it names one process, even after the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[19]


def process_tags() -> Dict[str, str]:
    """This process, as tags: a run whose process is gone while it is still RUNNING was killed."""
    return {"tweakpipe.host": socket.gethostname(), "tweakpipe.pid": str(os.getpid()),
            "tweakpipe.pid_started": process_started(os.getpid())}


def process_alive(pid: int, started: str) -> bool:
    """Whether the process that wrote ``(pid, started)`` still runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, under another user
    return not started or process_started(pid) in ("", started)


def mark_orphans_killed(client: Any) -> List[str]:
    """Mark KILLED every RUNNING run of this host whose process is gone (killed with SIGKILL, or the
    machine lost power): nothing else would ever end it. Returns their run ids."""
    host = socket.gethostname()
    experiments = [e.experiment_id for e in client.search_experiments()]
    if not experiments:
        return []
    quoted = host.replace("'", "\\'")
    found = client.search_runs(experiments, f"attributes.status = 'RUNNING' and tags.`tweakpipe.host` = '{quoted}'",
                               max_results=1000)
    killed = []
    for run in found:
        tags = run.data.tags
        pid = tags.get("tweakpipe.pid", "")
        if pid.isdigit() and not process_alive(int(pid), tags.get("tweakpipe.pid_started", "")):
            client.set_terminated(run.info.run_id, "KILLED")
            client.set_tag(run.info.run_id, "tweakpipe.killed", f"process {pid} on {host} was gone while the run "
                                                                 f"was RUNNING; marked KILLED by a later run")
            killed.append(run.info.run_id)
            log.warning("mlflow: run %s (pid %s on %s) was left RUNNING by a killed process; marked KILLED",
                        run.info.run_id, pid, host)
    return killed
