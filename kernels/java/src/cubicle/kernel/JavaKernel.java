package cubicle.kernel;

import java.io.OutputStream;
import java.io.PrintStream;
import java.lang.reflect.InvocationTargetException;
import java.lang.reflect.Method;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicLong;
import java.util.stream.Collectors;

import jdk.jshell.DeclarationSnippet;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.UnresolvedReferenceException;
import jdk.jshell.execution.DirectExecutionControl;
import jdk.jshell.spi.ExecutionControl;
import jdk.jshell.spi.ExecutionControlProvider;
import jdk.jshell.spi.ExecutionEnv;

import org.dflib.jjava.jupyter.channels.JupyterConnection;
import org.dflib.jjava.jupyter.channels.ShellReplyEnvironment;
import org.dflib.jjava.jupyter.kernel.BaseKernel;
import org.dflib.jjava.jupyter.kernel.BaseKernelBuilder;
import org.dflib.jjava.jupyter.kernel.KernelConnectionProperties;
import org.dflib.jjava.jupyter.kernel.LanguageInfo;
import org.dflib.jjava.jupyter.kernel.ReplacementOptions;
import org.dflib.jjava.jupyter.kernel.JupyterIO;
import org.dflib.jjava.jupyter.kernel.comm.CommManager;
import org.dflib.jjava.jupyter.kernel.display.DisplayData;
import org.dflib.jjava.jupyter.kernel.display.Renderer;
import org.dflib.jjava.jupyter.kernel.history.HistoryManager;
import org.dflib.jjava.jupyter.kernel.magic.MagicParser;
import org.dflib.jjava.jupyter.kernel.magic.MagicTranspiler;
import org.dflib.jjava.jupyter.kernel.magic.MagicsRegistry;
import org.dflib.jjava.jupyter.kernel.util.StringStyler;
import org.dflib.jjava.jupyter.messages.Message;
import org.dflib.jjava.jupyter.messages.request.ExecuteRequest;

/**
 * Cubicle's Java kernel: JShell in the kernel's own JVM, behind the Jupyter
 * protocol of jjava-jupyter. Code runs in this JVM (not a second one, as
 * plain JShell does) so that a result is the object itself: a String result
 * shows as its text, and System.setProperty lasts across executions. The
 * process environment is mirrored into system properties at start, which is
 * how e2b's Java kernel shows a sandbox's env vars (System.getProperty).
 */
public final class JavaKernel extends BaseKernel {
    private final JShell shell;
    private final Engine engine;

    private JavaKernel(String name, String version, HistoryManager history, JupyterIO io, CommManager comms,
            Renderer renderer, MagicTranspiler magics, MagicsRegistry registry, StringStyler errorStyler, Engine engine) {
        super(name, version,
                new LanguageInfo("java", Runtime.version().toString(), "text/x-java", ".java", "java", "java", "script"),
                List.of(), history, io, comms, renderer,
                new MagicParser("(?<=(?:^|=))\\s*%", "%%", magics), registry, false, errorStyler);
        this.engine = engine;
        this.shell = JShell.builder()
                .executionEngine(engine, Map.of())
                .out(System.out).err(System.err)
                .build();
        // The first evaluation compiles JShell's own prelude; pay it at start.
        shell.eval("int $cubicleWarm = 0;");
    }

    static final class Builder extends BaseKernelBuilder<Builder, JavaKernel> {
        @Override
        public JavaKernel build() {
            return new JavaKernel(buildName(), buildVersion(), buildHistoryManager(),
                    buildJupyterIO(buildJupyterIOEncoding()), buildCommManager(), buildRenderer(),
                    buildMagicTranspiler(), buildMagicsRegistry(), buildErrorStyler(), new Engine());
        }
    }

    @Override
    public Object evalRaw(String code) {
        SourceCodeAnalysis sca = shell.sourceCodeAnalysis();
        String remaining = code;
        Object last = null;
        boolean shown = false;
        while (remaining != null && !remaining.isBlank()) {
            SourceCodeAnalysis.CompletionInfo info = sca.analyzeCompletion(remaining);
            String source;
            switch (info.completeness()) {
                case COMPLETE:
                case COMPLETE_WITH_SEMI:
                    source = info.source();
                    remaining = info.remaining();
                    break;
                case EMPTY:
                    remaining = null;
                    continue;
                default:
                    // Incomplete or unparsable: JShell's own diagnostics say why.
                    source = remaining;
                    remaining = null;
            }
            shown = false;
            last = null;
            for (SnippetEvent ev : shell.eval(source)) {
                if (ev.causeSnippet() != null) {
                    continue;
                }
                if (ev.exception() != null) {
                    throw toUserError(ev.exception());
                }
                if (ev.status() == Snippet.Status.REJECTED) {
                    throw new CompilationException(diagnostics(ev.snippet()));
                }
                if (ev.status() == Snippet.Status.RECOVERABLE_NOT_DEFINED && ev.snippet() instanceof DeclarationSnippet) {
                    // JShell keeps a declaration that names what does not
                    // exist yet; a notebook user wants to hear about it.
                    List<String> missing = shell.unresolvedDependencies((DeclarationSnippet) ev.snippet())
                            .collect(Collectors.toList());
                    shell.drop(ev.snippet());
                    throw new CompilationException("cannot find symbol: " + String.join(", ", missing));
                }
                if (ev.value() != null && shows(ev.snippet())) {
                    last = engine.take(ev.value());
                    shown = true;
                }
            }
        }
        engine.clear();
        return shown ? (last == null ? "null" : last) : null;
    }

    private static boolean shows(Snippet s) {
        switch (s.subKind()) {
            case TEMP_VAR_EXPRESSION_SUBKIND:
            case VAR_VALUE_SUBKIND:
            case OTHER_EXPRESSION_SUBKIND:
                return true;
            default:
                return false;
        }
    }

    private String diagnostics(Snippet s) {
        List<String> lines = shell.diagnostics(s).filter(Diag::isError)
                .map(d -> d.getMessage(Locale.ROOT)).collect(Collectors.toList());
        return lines.isEmpty() ? "the code does not compile" : String.join("\n", lines);
    }

    private static RuntimeException toUserError(Exception e) {
        if (e instanceof UnresolvedReferenceException) {
            UnresolvedReferenceException u = (UnresolvedReferenceException) e;
            return new CompilationException("unresolved reference in " + u.getSnippet().source().strip());
        }
        if (e instanceof EvalException) {
            EvalException ee = (EvalException) e;
            UserException u = new UserException(ee.getExceptionClassName(), ee.getMessage());
            u.setStackTrace(ee.getStackTrace());
            return u;
        }
        return new UserException(e.getClass().getName(), e.getMessage());
    }

    @Override
    public List<String> formatError(Throwable e) {
        if (e instanceof CompilationException) {
            return List.of(e.getMessage());
        }
        return super.formatError(e);
    }

    /**
     * Each write to System.out or System.err during an execution is its own
     * stream message, as IJava (e2b's Java kernel, on Java 11) sends them:
     * println("x") is "x", then "\n".
     */
    @Override
    protected void replaceOutputStreams(ShellReplyEnvironment env) {
        super.replaceOutputStreams(env);
        System.setOut(flushingEachWrite(System.out));
        System.setErr(flushingEachWrite(System.err));
    }

    private static PrintStream flushingEachWrite(PrintStream inner) {
        return new PrintStream(new OutputStream() {
            @Override
            public void write(int b) {
                inner.write(b);
                inner.flush();
            }

            @Override
            public void write(byte[] b, int off, int len) {
                inner.write(b, off, len);
                inner.flush();
            }

            @Override
            public void flush() {
                inner.flush();
            }
        }, false, StandardCharsets.UTF_8) {
            // A subclass: PrintStream itself writes println's text and line
            // break in one write, a subclass in two (print, then newLine).
        };
    }

    /** A silent execution (the agent's env var snippets) is not counted. */
    @Override
    protected synchronized void handleExecuteRequest(ShellReplyEnvironment env, Message<ExecuteRequest> request) {
        super.handleExecuteRequest(env, request);
        if (request.getContent().isSilent()) {
            executionCount.decrementAndGet();
        }
    }

    @Override
    public DisplayData inspect(String code, int at, boolean extraDetail) {
        return null;
    }

    @Override
    public ReplacementOptions complete(String code, int at) {
        return null;
    }

    @Override
    public String isComplete(String code) {
        switch (shell.sourceCodeAnalysis().analyzeCompletion(code).completeness()) {
            case COMPLETE:
            case COMPLETE_WITH_SEMI:
            case EMPTY:
                return IS_COMPLETE_YES;
            case DEFINITELY_INCOMPLETE:
            case CONSIDERED_INCOMPLETE:
                return IS_COMPLETE_MAYBE;
            default:
                return IS_COMPLETE_BAD;
        }
    }

    @Override
    public void interrupt() {
        engine.interrupt();
    }

    @Override
    public void onShutdown(boolean restart) {
        shell.close();
    }

    /** A compile error: its message is JShell's diagnostics. */
    static final class CompilationException extends RuntimeException {
        CompilationException(String message) {
            super(message);
        }
    }

    /** An exception the user's code threw, named by its class. */
    static final class UserException extends RuntimeException {
        private final String className;

        UserException(String className, String message) {
            super(message);
            this.className = className;
        }

        @Override
        public String toString() {
            String m = getLocalizedMessage();
            return m == null ? className : className + ": " + m;
        }
    }

    /**
     * Runs each snippet on its own thread in this JVM and keeps the value
     * it returned under a key, which JShell carries as the snippet's value
     * string. interrupt() stops that thread, as JShell's local engine does.
     */
    static final class Engine extends DirectExecutionControl implements ExecutionControlProvider {
        private final Map<String, Object> values = new ConcurrentHashMap<>();
        private final AtomicLong next = new AtomicLong();
        private volatile Thread running;

        @Override
        public String name() {
            return "cubicle";
        }

        @Override
        public ExecutionControl generate(ExecutionEnv env, Map<String, String> parameters) {
            return this;
        }

        Object take(String key) {
            return values.remove(key);
        }

        void clear() {
            values.clear();
        }

        @Override
        protected String invoke(Method doit) throws Exception {
            Object[] result = new Object[1];
            Throwable[] thrown = new Throwable[1];
            Thread t = new Thread(() -> {
                try {
                    result[0] = doit.invoke(null);
                } catch (InvocationTargetException e) {
                    thrown[0] = e;
                } catch (Throwable e) {
                    thrown[0] = e;
                }
            }, "cubicle-java-exec");
            running = t;
            t.start();
            try {
                t.join();
            } finally {
                running = null;
            }
            if (thrown[0] instanceof InvocationTargetException) {
                if (thrown[0].getCause() instanceof ThreadDeath) {
                    throw new StoppedException();
                }
                throw (InvocationTargetException) thrown[0];
            }
            if (thrown[0] instanceof ThreadDeath) {
                throw new StoppedException();
            }
            if (thrown[0] instanceof Exception) {
                throw (Exception) thrown[0];
            }
            if (thrown[0] != null) {
                throw new RuntimeException(thrown[0]);
            }
            String key = "cubicle-value-" + next.incrementAndGet();
            values.put(key, result[0] == null ? NULL : result[0]);
            return key;
        }

        private static final Object NULL = new Object() {
            @Override
            public String toString() {
                return "null";
            }
        };

        @SuppressWarnings("removal")
        void interrupt() {
            Thread t = running;
            if (t != null) {
                t.stop();
            }
        }
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 1) {
            System.err.println("usage: JavaKernel CONNECTION_FILE");
            System.exit(2);
        }
        System.getenv().forEach((k, v) -> {
            if (System.getProperty(k) == null) {
                System.setProperty(k, v);
            }
        });
        KernelConnectionProperties props = KernelConnectionProperties.parse(Files.readString(Path.of(args[0])));
        JupyterConnection conn = new JupyterConnection(props);
        JavaKernel kernel = new Builder().name("cubicle-java").version("1").build();
        kernel.becomeHandlerForConnection(conn);
        conn.connect();
        conn.waitUntilClose();
    }
}
