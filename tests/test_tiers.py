"""The tiers of the suite (tests/tiers.py): tests that start Ray or a live server are marked so that `make
test-quick` leaves them out, and one that is not marked but starts either fails, naming the marker it needs."""

from __future__ import annotations

from pathlib import Path

import pytest

from .pytester_support import conftest_loading

pytest_plugins = ["pytester"]

TIERS = Path(__file__).resolve().parent / "tiers.py"
CONFTEST = conftest_loading(TIERS, "tiers") + '''tier_guard = tiers.tier_guard

def pytest_configure(config):
    config.addinivalue_line("markers", "live: starts a server")
    config.addinivalue_line("markers", "ray: uses Ray")

def pytest_collection_modifyitems(config, items):
    tiers.mark_tiers(items)
'''


@pytest.fixture
def suite(pytester):
    pytester.makeconftest(CONFTEST)
    return pytester


def test_an_unmarked_test_that_listens_on_a_port_fails_naming_live(suite):
    suite.makepyfile(test_a="""
        import socket

        def test_serves():
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            getattr(s, "listen")()  # a server on a port, in a form reading the source does not see
            s.close()
    """)
    result = suite.runpytest("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*listens on*mark it live*"])


def test_an_unmarked_test_that_starts_a_kvmesh_server_process_fails_naming_live(suite):
    suite.makepyfile(test_b="""
        import subprocess, sys

        def test_starts_serve():
            start = subprocess.Popen  # a process started in a form reading the source does not see
            proc = start([sys.executable, "-m", "kvmesh.cluster.cli", "serve", "--help"],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            proc.wait(120)
    """)
    result = suite.runpytest("-p", "no:cacheprovider")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*kvmesh.cluster.cli serve*a server process: mark it live*"])


def test_an_unmarked_test_that_starts_ray_fails_naming_ray(suite):
    suite.makepyfile(test_c="""
        import sys, types

        def test_starts_ray():
            ray = types.ModuleType("ray")
            state = {"up": False}
            ray.is_initialized = lambda: state["up"]
            sys.modules["ray"] = ray
            state["up"] = True  # what ray.init() leaves behind
    """)
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")  # this session's own Ray may be up already
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*starts Ray (mark it ray*"])


def test_tests_whose_fixtures_start_servers_are_marked_live_and_left_out_of_the_quick_tier(suite):
    suite.makeconftest(CONFTEST + """
import pytest

@pytest.fixture
def router():
    from somewhere import RouterServer
    return RouterServer(...)  # never run: the quick tier deselects the tests using it
""")
    suite.makepyfile(test_d="""
        import pytest

        def test_through_a_router(router):
            pass

        def test_pure():
            pass

        @pytest.mark.live
        def test_marked_by_hand_may_listen():
            import socket
            s = socket.socket(); s.bind(("127.0.0.1", 0)); getattr(s, "listen")(); s.close()
    """)
    quick = suite.runpytest("-p", "no:cacheprovider", "-m", "not ray and not live and not slow")
    quick.assert_outcomes(passed=1, deselected=2)
    everything = suite.runpytest("-p", "no:cacheprovider", "-k", "pure or by_hand")
    everything.assert_outcomes(passed=2, deselected=1)


def test_a_module_that_starts_servers_is_live_as_a_whole(suite):
    suite.makepyfile(test_e="""
        def start():
            return launched_fakes("a")  # a helper the tests call: reading the module finds it

        def test_helper_user():
            pass
    """)
    suite.runpytest("-p", "no:cacheprovider", "-m", "not live").assert_outcomes(deselected=1)


def test_the_quick_tier_skips_unimported_the_files_it_would_deselect_whole(suite):
    suite.makeconftest(CONFTEST + """
def pytest_ignore_collect(collection_path, config):
    return tiers.ignore_outside_quick_tier(collection_path, config)
""")
    broken = "import a_module_that_is_not_there\n\n"
    suite.makepyfile(test_live=broken + "def test_a():\n    launched_fakes('a')\n",
                     test_slow=broken + "import pytest\n\npytestmark = [pytest.mark.slow]\n\ndef test_b():\n    pass\n",
                     test_mixed="import pytest\n\n@pytest.mark.slow\ndef test_c():\n    pass\n\ndef test_d():\n"
                                "    pass\n")
    suite.runpytest("-p", "no:cacheprovider", "-m", "not ray and not live and not slow").assert_outcomes(
        passed=1, deselected=1)  # the two broken files never imported: nothing else in them could be in the tier
    for other in (["-m", "not live"], []):  # any other selection imports them (and stops at their errors)
        suite.runpytest("-p", "no:cacheprovider", *other).assert_outcomes(errors=2)


def test_the_listed_slow_files_and_tests_exist():
    tests = TIERS.parent
    for name in tiers_module().SLOW_FILES:
        assert (tests / name).is_file(), name
    for name in tiers_module().SLOW_TESTS:
        path, function = name.split("::")
        assert f"def {function}(" in (tests / path).read_text(), name


def tiers_module():
    from . import tiers

    return tiers


def test_the_measured_slow_tests_name_test_files_that_exist():
    tests = TIERS.parent
    measured = tiers_module().MEASURED_SLOW
    assert measured, "tests/slow_tests.json is empty or missing"
    for nodeid in measured:
        path, function = nodeid.removeprefix("tests/").split("::", 1)
        assert f"def {function.split('[')[0]}(" in (tests / path).read_text(), nodeid
