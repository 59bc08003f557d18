/* Link check of one src/ folder's library (CMakeLists.txt, motor_layer): it is linked
 * whole against its declared dependencies only, so any call into a folder it may not
 * use is an undefined symbol at build time. Never run. */
int main(void)
{
    return 0;
}
