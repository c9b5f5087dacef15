"""The provider installed as its users install it: the built wheel, plain pip, the ``spark`` extra, a fresh venv.

Why (issue #30): the repository's ``.venv`` is built from a lock, so a conflict that plain pip lets through never
shows there. One did: the ``spark`` extra once admitted the Spark provider 6.x, whose ``pyspark-client`` installs
its own ``pyspark`` package over pyspark 4.3.0's files. Nothing failed: ``pip check`` stayed clean while
``pyspark.__version__`` no longer matched the jars, and uninstalling either distribution later deleted files the
other one needs.

So this module builds the wheel from the work tree with pip, installs it with pip alone (no lock, no excludes, no
uv) into a new venv, and checks that environment: every file has one owner, ``pip check`` passes, pyspark's
Python code is the release of its jars, and the operator, imported from that environment, runs the triage job
through the Spark provider's ``SparkSubmitOperator`` on a ``local[1]`` master with the known answers.

The venv's interpreter is ``$BABELQUEUE_INSTALL_PYTHON`` (``python3.11`` by default, a name on PATH or a path);
``make install-check PYTHONS="3.11 3.12 3.13"`` runs this module once per version.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
import shutil
import subprocess
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.spark.dead_letters import write_drain_files

ROOT = Path(__file__).resolve().parents[2]
PYTHON_ENV = "BABELQUEUE_INSTALL_PYTHON"
DEFAULT_PYTHON = "python3.11"
PYSPARK = "4.3.0"  # the pin of the spark extra
CONN_ID = "spark_install_check"
#: Variables of the outer run that must not reach the new environment: they would point it at another Python
#: path, another Spark or the session's class archive (built for the repository's Spark files).
LEAKS = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON",
         "BABELQUEUE_SPARK_CLASS_ARCHIVE", "AIRFLOW_HOME", "PIP_REQUIRE_VIRTUALENV")

#: tests/spark/dead_letters.py's two drain files: 15 dead letters (8 failed, 2 unknown_urn,
#: 2 unsupported_schema_version, 3 poison), 4 of them drained twice, and one torn last line.
BY_REASON = {"failed": 8, "poison": 3, "unknown_urn": 2, "unsupported_schema_version": 2}


def shared_files(site_packages: list[Path]) -> dict[str, list[str]]:
    """Every file listed in the ``RECORD`` of more than one installed distribution, with those distributions.

    A path is resolved against the site-packages folder its ``RECORD`` lies in (entries such as
    ``../../../bin/pyspark`` included), so two distributions that write one file meet on one key.
    """
    owners: dict[str, set[str]] = {}
    for folder in site_packages:
        for record in sorted(folder.glob("*.dist-info/RECORD")):
            distribution = record.parent.name.removesuffix(".dist-info")
            with record.open(newline="", encoding="utf-8") as handle:
                for row in csv.reader(handle):
                    if row and row[0]:
                        path = os.path.normpath(folder / row[0])
                        owners.setdefault(path, set()).add(distribution)
    return {path: sorted(names) for path, names in sorted(owners.items()) if len(names) > 1}


def find_python(requested: str) -> str | None:
    """The interpreter to build the venv with: ``requested`` as a path or a name on PATH, if it runs.

    pyenv puts a shim named ``python3.12`` on PATH for every version it has, but the shim only runs the versions
    pyenv has selected; for another one, ``pythonX.Y`` resolves to pyenv's newest installed X.Y instead.
    """
    found = shutil.which(requested)
    if found and subprocess.run([found, "-c", ""], capture_output=True, check=False).returncode == 0:
        return found
    number, pyenv = re.fullmatch(r"python(\d+\.\d+)", requested), shutil.which("pyenv")
    if number is None or pyenv is None:
        return None
    latest = subprocess.run([pyenv, "latest", number.group(1)], capture_output=True, text=True, check=False)
    root = subprocess.run([pyenv, "root"], capture_output=True, text=True, check=False)
    if latest.returncode != 0 or root.returncode != 0:
        return None
    binary = Path(root.stdout.strip()) / "versions" / latest.stdout.strip() / "bin" / requested
    return str(binary) if binary.is_file() else None


def clean_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in LEAKS}
    env.update(extra)
    return env


def run(command: list[str | Path], *, timeout: float, env: dict[str, str] | None = None,
        cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command to completion; a failure fails the test with the command's output."""
    done = subprocess.run([str(part) for part in command], capture_output=True, text=True, timeout=timeout,
                          env=env or clean_env(), cwd=cwd, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(map(str, command))} exited {done.returncode}:\n{done.stdout[-3000:]}\n"
                    f"{done.stderr[-5000:]}")
    return done


@dataclass(frozen=True)
class Installed:
    """The fresh environment: its folder, its Python (and that Python's version) and its site-packages folders."""

    root: Path
    python: Path
    version: str
    site_packages: list[Path]

    def probe(self, code: str) -> object:
        """Evaluate Python code in the environment (outside the repository) and return what it prints as JSON."""
        done = run([self.python, "-c", code], timeout=120, cwd=self.root)
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    requested = os.environ.get(PYTHON_ENV, DEFAULT_PYTHON)
    interpreter = find_python(requested)
    if interpreter is None:
        pytest.fail(f"{PYTHON_ENV}={requested!r} names no interpreter that runs (not on PATH, nor a pyenv "
                    "version); install it or name another one")
    root = tmp_path_factory.mktemp("pip-install")
    venv = root / "venv"
    run([interpreter, "-m", "venv", venv], timeout=120)
    python = venv / "bin" / "python"
    # build the wheel with the new environment's pip (it fetches the build backend, hatchling, on its own)
    run([python, "-m", "pip", "wheel", "--no-deps", "--wheel-dir", root / "dist", ROOT], timeout=300, cwd=root)
    wheels = sorted((root / "dist").glob("airflow_provider_babelqueue-*.whl"))
    assert len(wheels) == 1, f"pip wheel should write one wheel of the provider, wrote {wheels}"
    # what the getting-started guide tells users to type: the wheel with its extra, resolved by pip
    run([python, "-m", "pip", "install", f"{wheels[0]}[spark]"], timeout=1200, cwd=root)
    info = json.loads(run([python, "-c", "import json, platform, sysconfig; p = sysconfig.get_paths(); "
                           "print(json.dumps([platform.python_version(), p['purelib'], p['platlib']]))"],
                          timeout=60, cwd=root).stdout)
    folders = list(dict.fromkeys(Path(path).resolve() for path in info[1:]))
    return Installed(root, python, info[0], folders)


def test_shared_files_names_both_owners_of_a_file(tmp_path: Path) -> None:
    """The ownership check itself: two RECORDs that list one file (in site-packages and in bin) are caught."""
    site = tmp_path / "lib" / "site-packages"
    for name, files in {"pyspark-4.3.0": ["pyspark/__init__.py", "pyspark/jars/a.jar", "../../bin/pyspark"],
                        "pyspark_client-4.2.0": ["pyspark/__init__.py", "pyspark/sql/connect.py",
                                                 "../../bin/pyspark"],
                        "orjson-3.11.0": ["orjson/__init__.py"]}.items():
        folder = site / f"{name}.dist-info"
        folder.mkdir(parents=True)
        rows = [*files, f"{name}.dist-info/RECORD"]
        (folder / "RECORD").write_text("".join(f"{row},sha256=x,1\n" for row in rows), encoding="utf-8")
    assert shared_files([site]) == {
        str(tmp_path / "bin" / "pyspark"): ["pyspark-4.3.0", "pyspark_client-4.2.0"],
        str(site / "pyspark" / "__init__.py"): ["pyspark-4.3.0", "pyspark_client-4.2.0"],
    }


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_installs_on_the_requested_python(installed: Installed) -> None:
    requested = os.environ.get(PYTHON_ENV, DEFAULT_PYTHON)
    number = re.search(r"(\d+\.\d+)$", Path(requested).name)
    if number:
        assert installed.version.startswith(number.group(1) + "."), (
            f"{PYTHON_ENV}={requested} built a venv on Python {installed.version}")
    prefix = installed.probe("import json, sys; print(json.dumps(sys.prefix))")
    assert Path(str(prefix)).resolve() == (installed.root / "venv").resolve()


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_no_file_is_owned_by_two_distributions(installed: Installed) -> None:
    shared = shared_files(installed.site_packages)
    listing = "\n".join(f"  {path}: {' and '.join(names)}" for path, names in list(shared.items())[:20])
    assert shared == {}, (f"{len(shared)} files are installed by two distributions (the second overwrote the "
                          f"first's; uninstalling either deletes them):\n{listing}")


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_pip_check_passes(installed: Installed) -> None:
    done = subprocess.run([str(installed.python), "-m", "pip", "check"], capture_output=True, text=True,
                          timeout=120, env=clean_env(), cwd=installed.root, check=False)
    assert done.returncode == 0, f"pip check found broken requirements:\n{done.stdout}{done.stderr}"


def test_the_envelope_decoder_reads_with_msgspec_in_the_install(installed: Installed) -> None:
    """A plain pip install brings msgspec (a declared dependency) and ``decode`` reads with its typed reader, not
    with the slower orjson path kept for an environment without it; a 2**63 integer is still refused there."""
    found = installed.probe(
        "import json, msgspec\n"
        "from airflow_provider_babelqueue.core import typed_read\n"
        "from airflow_provider_babelqueue import envelope as bq\n"
        "typed = typed_read.read_checked is not typed_read._unavailable\n"
        "try:\n"
        "    bq.decode(b'{\"n\": 9223372036854775808}')\n"
        "    refused = ''\n"
        "except bq.EnvelopeDecodeError as exc:\n"
        "    refused = str(exc)\n"
        "print(json.dumps([typed, typed_read.read_checked(b'{\"a\": [1, {\"b\": null}]}'), bool(msgspec.__version__),"
        " refused]))")
    assert isinstance(found, list)
    typed, read, versioned, refused = found
    assert (typed, read, versioned) == (True, {"a": [1, {"b": None}]}, True)
    assert "64-bit" in refused, refused


def test_the_console_page_is_served_from_the_installed_files(installed: Installed) -> None:
    """The console's page has no build step: the wheel carries ``plugins/static`` as committed, byte for byte
    (a stale or missing file in the wheel fails here), and the installed plugin mounts the console's routes."""
    found = installed.probe(
        "import json, hashlib, pathlib, airflow_provider_babelqueue.plugins.page as page\n"
        "folder = pathlib.Path(page.__file__).parent / 'static'\n"
        "print(json.dumps({p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}))")
    static = ROOT / "airflow_provider_babelqueue" / "plugins" / "static"
    assert found == {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(static.iterdir())}
    routes = installed.probe(
        "import json\nfrom airflow_provider_babelqueue.plugins.app import create_app\n"
        "print(json.dumps(sorted(r.path for r in create_app().routes if r.path.startswith('/console'))))")
    assert isinstance(routes, list) and {"/console/", "/console/app.js", "/console/api/queues",
                                         "/console/api/jobs/{job_id}"} <= set(routes)


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_pyspark_python_code_is_the_release_of_its_jars(installed: Installed) -> None:
    found = installed.probe(
        "import json, pathlib, pyspark; from importlib import metadata; "
        "print(json.dumps([pyspark.__version__, str(pathlib.Path(pyspark.__file__).parent), "
        "sorted(d.metadata['Name'] for d in metadata.distributions() if 'pyspark' in d.metadata['Name'].lower()), "
        "metadata.version('pyspark')]))")
    assert isinstance(found, list)
    python_version, folder, distributions, dist_version = found
    assert distributions == ["pyspark"], f"only pyspark itself may provide the pyspark package: {distributions}"
    jars = sorted(path.name for path in Path(folder).glob("jars/spark-core_*.jar"))
    assert len(jars) == 1, f"pyspark should ship one spark-core jar in {folder}/jars, found {jars}"
    jar = re.fullmatch(r"spark-core_\d+\.\d+-(.+)\.jar", jars[0])
    assert jar is not None, f"unexpected spark-core jar name {jars[0]}"
    assert (python_version, dist_version) == (jar.group(1), jar.group(1)), (
        f"pyspark's Python code reports {python_version} (distribution {dist_version}) beside the jar {jars[0]}")
    assert python_version == PYSPARK


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_operator_runs_the_triage_job_from_the_install(installed: Installed) -> None:
    drain_dir, output_dir = installed.root / "drained", installed.root / "triage"
    write_drain_files(drain_dir)
    venv_bin = installed.python.parent
    env = clean_env(
        PATH=f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",  # the environment's own spark-submit
        AIRFLOW_HOME=str(installed.root / "airflow"), AIRFLOW__CORE__LOAD_EXAMPLES="False",
        **{f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps({"conn_type": "spark", "host": "local[1]"})})
    script = Path(__file__).with_name("run_triage.py")
    done = run([installed.python, script, drain_dir, output_dir, CONN_ID], timeout=600, env=env,
               cwd=installed.root)
    results = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(results) == 1, f"the script should print one RESULT line:\n{done.stdout[-3000:]}"
    result = json.loads(results[0].removeprefix("RESULT "))
    for module in ("package", "spark_provider"):
        assert Path(result[module]).resolve().is_relative_to(installed.site_packages[0]), (
            f"{module} was imported from {result[module]}, not from the new environment")
    assert result["returned"] == {"job": "triage", "input": str(drain_dir), "output": str(output_dir),
                                  "summary": str(output_dir / "_triage_summary.json")}

    summary = json.loads((output_dir / "_triage_summary.json").read_text(encoding="utf-8"))
    # 15 + 4 duplicates + the torn line; the torn line is counted and left out
    assert {key: summary[key] for key in ("records", "rows", "duplicates_removed", "unreadable", "poison",
                                          "by_reason")} == {
        "records": 20, "rows": 15, "duplicates_removed": 4, "unreadable": 1, "poison": 3, "by_reason": BY_REASON,
    }
    assert summary["unreadable_by_cause"]["torn"] == 1
    folders = sorted(path.name for path in output_dir.iterdir() if path.is_dir())
    assert folders == [f"reason={reason}" for reason in sorted(BY_REASON)]
    rows = pq.read_table(output_dir).to_pylist()
    assert Counter(row["reason"] for row in rows) == BY_REASON
    assert sum(row["copies"] for row in rows) == 19, "each duplicate is counted in its row's copies"
