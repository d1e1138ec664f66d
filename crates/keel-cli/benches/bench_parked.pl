# The parked agent of `BENCH_AGENT=perl cargo bench -p keel-cli --bench parked`: what
# bench_parked.py does (hello, wait on ipc.recv and be swapped out meanwhile, then finish
# with the message it got), in protocol 1 written by hand with perl's built-in socket calls
# and no module (loading one costs 15-30 ms on a slow host), so that a run costs about
# 3 ms of interpreter start instead of Python's 50 and 100,000 runs fit in minutes.
use strict;

socket(my $kernel, 1, 1, 0) or die "socket: $!";    # AF_UNIX, SOCK_STREAM
connect($kernel, pack("S Z*", 1, $ENV{KEEL_SOCKET})) or die "connecting to KEEL_SOCKET: $!";
select((select($kernel), $| = 1)[0]);

# One request, its answer line; a refused call ends the agent with the kernel's error.
sub call {
    my ($id, $method, $params) = @_;
    print $kernel qq({"jsonrpc":"2.0","id":$id,"method":"$method","params":$params}\n);
    my $answer = <$kernel>;
    die "$method: the kernel closed the connection\n" unless defined $answer;
    die "$method: $answer" unless $answer =~ /"result":/;
    return $answer;
}

call(0, "hello", qq({"token":"$ENV{KEEL_RUN_TOKEN}"}));
my $received = call(1, "ipc.recv", "{}");
# The benchmark sends {"go": i}.
my ($go) = $received =~ /"go":(\d+)/ or die "ipc.recv: no message in $received";
call(2, "run.exit", qq({"output":{"got":{"go":$go}}}));
